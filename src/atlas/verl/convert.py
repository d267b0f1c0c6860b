"""From a verl run's outputs to this project's journal, so `journal.assemble` builds the same run
folder (records, trajectories, step metrics, call advantages, validation curve, protocol) as a
local run, and the report's tables come out the same.

    records_dir/<phase>/global_step_<g>/*.json   one file per episode, written by the agent loop
    metrics files (verl's `file` logger)          {"step": g, "data": {...}} per line, one file per
                                                  launch (a resumed launch starts a new file;
                                                  the later line for a step wins)
    verl checkpoints: <checkpoints>/global_step_<g>/

    --> journal/step_<k>/   (k = g - 1: verl counts steps done, 1-based; our steps are 0-based)
            records.parquet, trajectories.parquet, protocol.json, metrics.json,
            call_advantages.parquet, samples.json
        journal/val_<g>/    records, trajectories, protocol.json, validation.json

Step metrics keep the names both sides share (verl's); the episode-level ones (protocol counts,
scores by source, lengths in generated tokens, turns) are recomputed from the records exactly as
the local trainer computes them, overriding verl's where the meaning differs (verl's
response_length counts tool tokens too). verl's other metrics stay in its own files. verl keeps
critic values and advantages inside its trainer, so the records' `value` and `advantage` and the
call-advantage statistics are null for a verl run.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from atlas.contracts.protocol import PINNED_COUNTS
from atlas.contracts.runs import STEP_METRICS
from atlas.hashing import MANIFEST, aside_path, atomic_write_json, sha256_file
from atlas.rl import journal
from atlas.rl.metrics import call_advantages, rollout_throughput, step_summary
from atlas.runtime.inputs import TrainingInputs
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.records import Credit, ExecutionRecord, split_row
from atlas.runtime.rollouts import validation_rows
from atlas.runtime.runfolder import write_rollouts


class VerlOutputError(ValueError):
    """verl's outputs are missing a step, an episode or a metric the run folder needs."""


@dataclass
class StoredEpisode:
    """An episode read back from the agent loop's file: what the run folder's writers read."""

    question: dict[str, str]
    sample: int
    prompt_tokens: int
    token_ids: list[int]
    loss_mask: list[int]
    sampled: list[int]
    logprobs: list[float]
    end_reason: str
    score: float
    records: list[ExecutionRecord]
    credits: list[Credit]  # record k's reward and potentials (value and advantage: verl's own)
    generations: list[None] = field(default_factory=list)  # only counted (one per turn)
    protocol: dict[str, Any] = field(default_factory=dict)


def read_episode(path: Path, step: int | None = None) -> StoredEpisode:
    """An episode file of the agent loop, its records numbered `step` (the agent loop stamps
    verl's 1-based global step; ours is 0-based for training; None: as the file has it)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        rows = [split_row(r if step is None else {**r, "step": step}) for r in body["records"]]
        return StoredEpisode(
            question={"question_uid": body["question_uid"], "source": body["source"]},
            sample=body["sample"],
            prompt_tokens=body["prompt_tokens"],
            token_ids=body["token_ids"],
            loss_mask=body["loss_mask"],
            sampled=body["sampled"],
            logprobs=body["logprobs"],
            end_reason=body["end_reason"],
            score=body["score"],
            records=[record for record, _ in rows],
            credits=[credit for _, credit in rows],
            generations=[None] * body["turns"],
            protocol=body["protocol"],
        )
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise VerlOutputError(f"{path}: not an atlas agent-loop episode file ({err!r})") from None


def failures(folder: Path) -> list[str]:
    """The agent loop's reasons for the episodes of this folder that produced no output."""
    out = []
    for path in sorted((folder / "failed").glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        out.append(f"{body['question_uid']} sample {body['sample']}: {body['error']}: {body['message']}")
    return out


def retire_episodes(episodes: Path, done: int) -> Path | None:
    """Before a launch that resumes from verl's checkpoint of `done` steps (0: none), move the
    episode folders verl writes again to `episodes`.earlier-<n>/ (never deleted): training steps
    after `done`, and validation points from `done` on (verl validates again on resuming,
    trainer.val_before_train). A killed attempt's file for a sample that fails on the rerun
    would otherwise be counted as that sample's episode. Returns where they went, or None."""

    def step(folder: Path) -> int:
        number = folder.name.removeprefix("global_step_")
        return int(number) if number.isdigit() else -1

    stale = [
        folder
        for phase, first in (("train", done + 1), ("val", done))
        for folder in sorted((episodes / phase).glob("global_step_*"))
        if step(folder) >= first
    ]
    if not stale:
        return None
    aside = aside_path(episodes, "earlier")
    for folder in stale:
        target = aside / folder.relative_to(episodes)
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(target)
    return aside


def read_episodes(folder: Path, expected: int, step: int | None = None) -> list[StoredEpisode]:
    """The episodes of one step or validation point (their records numbered `step`), in
    (question, sample) order; exactly `expected` (questions x samples) of them. verl trains on the rest of a batch when a sample's
    agent loop raises; here a missing episode fails the run, with the count and the reasons."""
    paths = sorted(folder.glob("*.json"))
    if len(paths) != expected:
        reasons = failures(folder)
        listed = "".join(f"\n  {r}" for r in reasons[:20]) or " none recorded (did the agent loop run?)"
        raise VerlOutputError(
            f"{folder}: {len(paths)} episodes, expected {expected} (questions x samples); "
            f"{len(reasons)} failed, reasons:{listed}"
        )
    episodes = [read_episode(p, step) for p in paths]
    return sorted(episodes, key=lambda ep: (ep.question["question_uid"], ep.sample))


def protocol_of(episodes: list[StoredEpisode]) -> ProtocolReport:
    total = ProtocolReport()
    for ep in episodes:
        for key in PINNED_COUNTS:
            setattr(total, key, getattr(total, key) + ep.protocol[key])
        total.violation_rows.extend(ep.protocol["violation_rows"])
    return total


def read_metrics(files: list[Path]) -> dict[int, dict[str, Any]]:
    """verl's per-step metrics by global step; files in launch order, the later line wins."""
    out: dict[int, dict[str, Any]] = {}
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.setdefault(int(row["step"]), {}).update(row["data"])
            except (KeyError, TypeError, ValueError) as err:
                raise VerlOutputError(f"{path}:{n}: not a verl file-logger line ({err!r})") from None
    return out


def step_metrics(verl: dict[str, Any], episodes: list[StoredEpisode], report: ProtocolReport) -> dict:
    """The declared step metrics: verl's where the names agree, ours from the records otherwise."""
    metrics = {k: float(v) for k, v in verl.items() if k in STEP_METRICS and v is not None}
    metrics.update(step_summary(episodes, report))
    metrics["timing_s/gen_tools"] = sum(r.timing_s_tool for ep in episodes for r in ep.records)
    metrics.update(rollout_throughput(episodes, metrics.get("timing_s/gen")))
    return metrics


def write_journal(
    root: Path,
    *,
    run: str,
    steps: int,
    validated: list[int],
    records_dir: Path,
    metrics_files: list[Path],
    gamma: float,
    dose: float,
    expected: dict[str, int],
) -> dict[str, int]:
    """Fill root/journal/ from verl's outputs for steps 0..steps-1 and the validation points.
    `expected` holds the episodes each folder must have: "train" per step (questions x samples),
    "val" per validation point. Returns the episodes counted per folder."""
    counted: dict[str, int] = {}
    verl_metrics = read_metrics(metrics_files)
    for k in range(steps):
        g = k + 1
        if g not in verl_metrics:
            raise VerlOutputError(f"no metrics for global step {g} in {[str(p) for p in metrics_files]}")
        # the agent loop stamps verl's global step g; ours is 0-based
        episodes = read_episodes(records_dir / "train" / f"global_step_{g}", expected["train"], k)
        counted[f"train/global_step_{g}"] = len(episodes)
        credits = [ep.credits for ep in episodes]
        report = protocol_of(episodes)
        journal.write_step_rollouts(root, k, episodes, credits, report, run=run)
        journal.write_step_results(
            root,
            k,
            step_metrics(verl_metrics[g], episodes, report),
            call_advantages(episodes, credits, run=run, step=k, gamma=gamma, dose=dose),
            [],
        )
    for done in validated:
        episodes = read_episodes(records_dir / "val" / f"global_step_{done}", expected["val"], done)
        counted[f"val/global_step_{done}"] = len(episodes)
        for ep in episodes:
            for r in ep.records:
                if r.phase != "val":
                    raise VerlOutputError(f"{records_dir}/val/global_step_{done}: a {r.phase!r} record")
        report = protocol_of(episodes)
        folder = journal.val_dir(root, done)
        folder.mkdir(parents=True, exist_ok=True)
        write_rollouts(
            folder, episodes, report, run=run, step=done, phase="val", credits=[ep.credits for ep in episodes]
        )
        atomic_write_json(folder / "validation.json", validation_rows(episodes, run=run, step=done))
    atomic_write_json(root / "verl" / "episode_counts.json", {"expected": expected, "counted": counted})
    return counted


def verl_checkpoints(folder: Path) -> list[dict[str, Any]]:
    """verl's checkpoint folders (global_step_<g>) with every file's sha256 and size."""
    out = []
    for step in sorted(folder.glob("global_step_*"), key=lambda p: int(p.name.split("_")[-1])):
        files = {
            f.relative_to(step).as_posix(): {"sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(step.rglob("*"))
            if f.is_file()
        }
        out.append({"global_step": int(step.name.split("_")[-1]), "path": step.as_posix(), "files": files})
    return out


def policy_checkpoints(root: Path, index: list[dict[str, Any]]) -> list[int]:
    """Each verl checkpoint as root/step_<g>/{actor,critic}.safetensors (our trainable names), the
    files the validation stage reads; a complete one (MANIFEST.json) is kept. Returns the steps."""
    from atlas.verl.export import write_policy_checkpoint

    steps = []
    for c in index:
        g, out = c["global_step"], root / f"step_{c['global_step']}"
        if not (out / MANIFEST).is_file():
            shutil.rmtree(out, ignore_errors=True)
            write_policy_checkpoint(
                Path(c["path"]), out, {"stage": "verl_checkpoint", "config": {"global_step": g}}
            )
        steps.append(g)
    return steps


def export_policy(folder: Path, model_dir: Path, s: dict, last: Path | None) -> None:
    """adapters/{actor,critic} (PEFT) + the value head from the last checkpoint, as a local run
    exports them, and the index of verl's own checkpoint files."""
    from safetensors.torch import load_file

    from atlas.config.training import TrainSlice
    from atlas.model.policy import ActorCritic
    from atlas.rl.checkpoint import export_adapters
    from atlas.runtime.session import load_model

    if last is None:
        raise VerlOutputError(f"no verl checkpoint under {folder}: nothing to export as the run's policy")
    base, _ = load_model(model_dir)
    ac = ActorCritic(base, TrainSlice.model_validate(s).training, seed=s["seed"])
    for role in ("actor", "critic"):
        tensors = load_file(str(last / f"{role}.safetensors"))
        params = ac.trainable(role)
        if set(tensors) != set(params):
            raise VerlOutputError(
                f"{last}/{role}.safetensors: its tensors are not the {role}'s trainable ones"
            )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[name])
    export_adapters(ac, folder)


def assemble_run(
    inputs: TrainingInputs,
    root: Path,
    out: Path,
    s: dict,
    *,
    name: str,
    steps: int,
    validated: list[int],
    module: str,
    code,
) -> None:
    """The run folder `out` from the journal under `root` (journal.assemble), with verl's
    checkpoints converted to policy checkpoints (checkpoints.json) and the last one exported as
    adapters/. `inputs` are the files the run read, for its manifest."""
    index = verl_checkpoints(root / "verl" / "checkpoints")
    saved = policy_checkpoints(root, index)
    run_cfg = s["training"]["run"]

    def export(folder: Path) -> None:
        export_policy(folder, inputs.model, s, root / f"step_{saved[-1]}" if saved else None)
        atomic_write_json(folder / "verl_checkpoints.json", index)

    journal.assemble(
        out,
        root,
        run=name,
        steps=steps,
        validated=validated,
        checkpoints=saved,
        run_info={
            "run": name,
            "steps": steps,
            "engine": "verl",
            "potential": run_cfg["potential"],
            "dose": run_cfg["dose"],
            "verl_checkpoints": [c["path"] for c in index],
            "checkpoints": root.as_posix(),
        },
        export=export,
        manifest={"stage": name, "inputs": inputs.files(), "code": code(module), "config": s},
    )
