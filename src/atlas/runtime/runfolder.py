"""What every rollout run folder holds: records.parquet, trajectories.parquet, protocol.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from atlas.contracts.records import TRAJECTORY_SCHEMA
from atlas.hashing import atomic_dir, atomic_path, atomic_write_json, write_manifest
from atlas.runtime.inputs import RolloutInputs
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.records import Credit, write_records


def trajectory_row(ep, *, run: str, step: int, phase: str) -> dict:
    return {
        "run": run,
        "step": step,
        "phase": phase,
        "question_uid": ep.question["question_uid"],
        "source": ep.question["source"],
        "sample": ep.sample,
        "prompt_tokens": ep.prompt_tokens,
        "token_ids": ep.token_ids,
        "loss_mask": ep.loss_mask,
        "sampled": ep.sampled,
        "logprobs": ep.logprobs,
        "completed": ep.end_reason == "submit",
        "end_reason": ep.end_reason,
        "score": ep.score,
        "turns": len(ep.generations),
    }


def write_rollouts(
    folder: str | Path,
    episodes,
    report: ProtocolReport,
    *,
    run: str,
    step: int,
    phase: str,
    credits: list[list[Credit]] | None = None,
) -> None:
    """records.parquet (each record with its credit: `credits` per episode, in record order;
    none: reward = score), trajectories.parquet and protocol.json of `episodes`."""
    folder = Path(folder)
    records = [r for ep in episodes for r in ep.records]
    if credits is not None and len(credits) != len(episodes):
        raise ValueError(f"credits for {len(credits)} episodes, {len(episodes)} episodes")
    flat = None if credits is None else [c for mine in credits for c in mine]
    write_records(folder / "records.parquet", records, flat)
    rows = [trajectory_row(ep, run=run, step=step, phase=phase) for ep in episodes]
    with atomic_path(folder / "trajectories.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), tmp, compression="zstd")
    atomic_write_json(folder / "protocol.json", {"run": run, **report.to_json()})


def write_rollout_stage(
    out: Path,
    episodes,
    report: ProtocolReport,
    *,
    run: str,
    inputs: RolloutInputs,
    config: dict[str, Any],
    code: list[str],
    extra: dict[str, Any] | None = None,
) -> None:
    """A validation-phase rollout stage's whole folder (rollouts, `extra` JSON files, manifest),
    renamed into place at once. The manifest holds the files the stage read (`inputs`), its code
    files and its config slice."""
    with atomic_dir(out) as tmp:
        write_rollouts(tmp, episodes, report, run=run, step=0, phase="val")
        for name, value in (extra or {}).items():
            atomic_write_json(tmp / name, value)
        write_manifest(
            tmp,
            stage=run,
            inputs=inputs.files(),
            code=code,
            config=config,
        )
