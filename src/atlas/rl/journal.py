"""Where a training run keeps its work while it runs, and how the finished run folder is built.

    results/checkpoints/<run>/          not a declared output: a rerun of an interrupted job finds it
        fingerprint.json                config slice + input hashes the work below was made with
        step_<k>/                       compact checkpoints (atlas.rl.checkpoint), k = steps done
        journal/step_<k>/               step k's rollouts: records.parquet, trajectories.parquet,
                                        protocol.json (written once, before the update), then
                                        metrics.json, call_advantages.parquet and samples.json
                                        (device readings) after it
        journal/val_<k>/                validation after k steps: records, trajectories,
                                        protocol.json, validation.json
        wandb/                          the live wandb log
        wandb.earlier-<n>/              the log of an attempt that was killed (atlas.rl.tracking)

    results/runs/<run>/                 the declared output, written at the end, all at once:
        records.parquet, trajectories.parquet   train and validation phases together
        step_metrics.parquet            one row per step (verl metric names; timing_s/*, perf/*)
        call_advantages.parquet         per step, turn and tool
        device_samples.json             sampled RSS / CPU (and nvidia-smi) readings per step
        validation.parquet              per validation point and source: the arm's curve
        protocol.json                   counts over every train and validation episode
        checkpoints.json                every checkpoint's path and file hashes
        adapters/{actor,critic}/        the final policy as PEFT adapters (+ the value head)
        run.json, wandb/, MANIFEST.json

A fingerprint that differs from the current one (other config or inputs) means the work there is
not this run's: it is moved aside to <run>.stale-<hash> (<run>.stale-<hash>-<n> where that name is
taken), never deleted, and the run starts over.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from atlas.contracts import runs
from atlas.contracts.parquet import read_table
from atlas.contracts.records import RECORD_SCHEMA, TRAJECTORY_SCHEMA
from atlas.hashing import (
    MANIFEST,
    atomic_dir,
    atomic_path,
    atomic_write_json,
    canonical_json,
    sha256_bytes,
    write_manifest,
)
from atlas.rl.tracking import copy_logs
from atlas.runtime.runfolder import write_rollouts

logger = logging.getLogger(__name__)

FINGERPRINT = "fingerprint.json"


def open_root(root: Path, fingerprint: dict[str, Any], resume_mode: str, run: str) -> str:
    """Prepare the run's working folder: keep it (same fingerprint), or move it aside. Returns
    the fingerprint's sha256."""
    digest = sha256_bytes(canonical_json(fingerprint).encode())
    path = root / FINGERPRINT
    if root.exists() and resume_mode == "disable":
        logger.info("%s: resume_mode disable: removing earlier work folder=%s", run, root)
        shutil.rmtree(root)
    elif path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old.get("sha256") != digest:
            aside = _free_aside(root, f"stale-{old.get('sha256', 'unknown')[:12]}")
            root.rename(aside)
            logger.info(
                "%s: earlier work was made with another config or inputs; moved aside to=%s", run, aside
            )
    elif root.exists() and any(root.iterdir()):
        aside = _free_aside(root, "stale-unfingerprinted")
        root.rename(aside)
        logger.info("%s: earlier work has no fingerprint; moved aside to=%s", run, aside)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"sha256": digest, **fingerprint})
    return digest


def _free_aside(root: Path, label: str) -> Path:
    """<root>.<label>, or <root>.<label>-<n> (n from 2) where an earlier aside holds that name:
    an aside is never replaced, so no work is lost."""
    aside, n = root.with_name(f"{root.name}.{label}"), 2
    while aside.exists() or aside.is_symlink():
        aside, n = root.with_name(f"{root.name}.{label}-{n}"), n + 1
    return aside


def validation_points(steps: int, every: int) -> list[int]:
    """Steps done at which the policy is validated: before training, every k, and at the end."""
    return sorted({0, steps, *range(every, steps + 1, every)})


def checkpoint_points(steps: int, every: int) -> list[int]:
    return sorted({steps, *range(every, steps + 1, every)})


def step_dir(root: Path, step: int) -> Path:
    return root / "journal" / f"step_{step}"


def val_dir(root: Path, completed: int) -> Path:
    return root / "journal" / f"val_{completed}"


def write_step_rollouts(root: Path, step: int, episodes, credits, report, *, run: str) -> None:
    """Step k's records (with their credits: `credits` per episode), trajectories and protocol
    counts, written once, before the step's update."""
    folder = step_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    write_rollouts(folder, episodes, report, run=run, step=step, phase="train", credits=credits)


def write_step_results(
    root: Path, step: int, metrics: dict[str, float], call_rows: list[dict], samples: list[dict]
) -> None:
    """Step k's results after its update. The trainer writes them before checkpoint k+1, so a
    checkpoint never exists without the journal of every step before it."""
    folder = step_dir(root, step)
    atomic_write_json(folder / "samples.json", samples)
    write_table(folder / "call_advantages.parquet", call_rows, runs.CALL_ADVANTAGES_SCHEMA)
    write_step_metrics(root, step, metrics)


def write_step_metrics(root: Path, step: int, metrics: dict[str, float]) -> None:
    """Step k's metrics.json, checked against the step-metric schema first (a bad value fails at
    the step, not at the end); written again once a checkpoint save has been timed."""
    path = step_dir(root, step) / "metrics.json"
    runs.arrow_table([metrics], runs.STEP_METRICS_SCHEMA, str(path))
    atomic_write_json(path, metrics)


def write_validation(root: Path, completed: int, episodes, report, rows: list[dict], *, run: str) -> None:
    folder = val_dir(root, completed)
    folder.mkdir(parents=True, exist_ok=True)
    write_rollouts(folder, episodes, report, run=run, step=completed, phase="val")
    atomic_write_json(folder / "validation.json", rows)


def write_table(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    with atomic_path(path) as tmp:
        runs.table(rows, schema, str(path)).write_parquet(tmp, compression="zstd")


def _concat(paths: list[Path], schema: pa.Schema) -> pa.Table:
    tables = [read_table(p).cast(schema) for p in paths]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _protocol_totals(paths: list[Path]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    rows: list[dict] = []
    for p in paths:
        one = json.loads(p.read_text(encoding="utf-8"))
        for k, v in one.items():
            if isinstance(v, int) and not isinstance(v, bool):
                total[k] = total.get(k, 0) + v
        rows.extend(one.get("violation_rows", []))
    return {**total, "violation_rows": rows}


def _read_samples(path: Path) -> list[dict]:
    """A step's device readings; a journal written before the sampler existed has none."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def checkpoint_index(root: Path, steps: list[int]) -> dict[str, Any]:
    """Each checkpoint's folder and its MANIFEST's file hashes (what a snapshot reader verifies)."""
    out = []
    for k in steps:
        manifest = json.loads((root / f"step_{k}" / MANIFEST).read_text(encoding="utf-8"))
        out.append({"step": k, "path": (root / f"step_{k}").as_posix(), "files": manifest["files"]})
    return {"checkpoints": out}


def assemble(
    out: Path,
    root: Path,
    *,
    run: str,
    steps: int,
    validated: list[int],
    checkpoints: list[int],
    run_info: dict[str, Any],
    export,
    manifest: dict[str, Any],
) -> None:
    """Build results/runs/<run>/ from the journal, atomically. `export(folder)` writes adapters/."""
    train = [step_dir(root, k) for k in range(steps)]
    val = [val_dir(root, k) for k in validated]
    with atomic_dir(out) as tmp:
        for name, schema in (("records.parquet", RECORD_SCHEMA), ("trajectories.parquet", TRAJECTORY_SCHEMA)):
            table = _concat([d / name for d in (*train, *val)], schema)
            pq.write_table(table, tmp / name, compression="zstd")
        metrics = [
            {"run": run, "step": k, **json.loads((d / "metrics.json").read_text())}
            for k, d in enumerate(train)
        ]
        runs.table(metrics, runs.STEP_METRICS_SCHEMA, "step metrics").write_parquet(
            tmp / "step_metrics.parquet", compression="zstd"
        )
        calls = [row for d in train for row in pl.read_parquet(d / "call_advantages.parquet").to_dicts()]
        runs.table(calls, runs.CALL_ADVANTAGES_SCHEMA, "call advantages").write_parquet(
            tmp / "call_advantages.parquet", compression="zstd"
        )
        curve = [row for d in val for row in json.loads((d / "validation.json").read_text())]
        runs.table(curve, runs.VALIDATION_CURVE_SCHEMA, "validation curve").write_parquet(
            tmp / "validation.parquet", compression="zstd"
        )
        protocol = {
            "run": run,
            "train": _protocol_totals([d / "protocol.json" for d in train]),
            "val": _protocol_totals([d / "protocol.json" for d in val]),
        }
        totals = _protocol_totals([d / "protocol.json" for d in (*train, *val)])
        atomic_write_json(tmp / "protocol.json", {**totals, **protocol})
        samples = [{"step": k, "samples": _read_samples(d / "samples.json")} for k, d in enumerate(train)]
        atomic_write_json(tmp / "device_samples.json", samples)
        atomic_write_json(tmp / "checkpoints.json", checkpoint_index(root, checkpoints))
        # checkpoints moved aside as corrupt before a resume (atlas.rl.recovery), in order
        recovered = json.loads(rec.read_text()) if (rec := root / "recovery.json").is_file() else []
        atomic_write_json(tmp / "run.json", {**run_info, "recovered": recovered})
        export(tmp / "adapters")
        copy_logs(root, tmp / "wandb")
        write_manifest(tmp, **manifest)
