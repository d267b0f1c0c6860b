"""Grader-aware resume: re-grade a run's journaled records with the current graders before resuming.

A grader fix reruns the training job (its code is an input), but the fix may change no reward
this run ever earned, or only rewards from step k on. So before resuming, every executed call of
the journal is run again through the same tools and graders (atlas.runtime.execute), and its
score compared with the recorded one:

    no score changed          keep everything: the run is re-assembled, not retrained
    first change at step k    resume from the last checkpoint at or before k (0: from scratch)
    a validation point j <= that checkpoint changed
                              validate again at j, from checkpoint j (or the initial policy)

Only scores decide, as rewards come only from them. A tool output that differs while its score
does not (a program printing a set, or a time) is counted in regrade.json but kept: it is what
the policy saw. Work that no longer counts is moved to <root>.superseded-<n>/, never deleted.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.contracts.parquet import read_table
from atlas.hashing import aside_path, atomic_write_json, sha256_bytes
from atlas.rl.journal import step_dir, val_dir
from atlas.runtime.execute import execute_call
from atlas.runtime.tools import CodeBounds, tools_for

REGRADE = "regrade.json"


@dataclass
class FolderRegrade:
    """One journal folder (a training step or a validation point) re-graded."""

    folder: str
    calls: int  # executed calls run again
    score_changes: list[str] = field(default_factory=list)  # one line per changed record
    output_changes: int = 0  # records whose tool output differs but whose score does not


def regrade_folder(
    folder: Path, questions: dict[str, dict], tests: dict, runtime: RuntimeConfig, graders: GraderConfig
) -> FolderRegrade:
    """Run each executed call of folder/records.parquet again; compare scores and outputs.
    Refused calls are left alone: a refusal comes from the parser and the offered tools."""
    path = folder / "records.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; the journal of a finished step always has it")
    code = CodeBounds.of(runtime)
    rows = [r for r in read_table(path).to_pylist() if r["tool_status"] != "refused"]

    def again(r: dict):
        uid = r["question_uid"]
        if uid not in questions:
            raise KeyError(f"{path}: question {uid} is not in this run's question inputs")
        tool = tools_for(r["source"], code)[r["tool"]]
        call = {"name": r["tool"], "arguments": json.loads(r["arguments"])}
        return execute_call(
            call,
            None,
            {r["tool"]: tool},
            questions[uid],
            tests.get(uid, []),
            graders,
            runtime.tool_output_chars,
        )

    with ThreadPoolExecutor(max_workers=graders.workers) as pool:
        results = list(pool.map(again, rows))
    out = FolderRegrade(folder=folder.as_posix(), calls=len(rows))
    for r, result in zip(rows, results, strict=True):
        if result.score != r["score"]:
            out.score_changes.append(
                f"{r['question_uid']} sample {r['sample']} turn {r['turn']} {r['tool']}: "
                f"score {r['score']:g} -> {result.score:g}"
            )
        elif sha256_bytes(result.output.encode("utf-8")) != r["tool_output_sha256"]:
            out.output_changes += 1
    return out


@dataclass
class ResumePlan:
    """Where a run resumes after re-grading, and which validation points run again."""

    latest: int  # the latest complete checkpoint before re-grading
    start: int  # the checkpoint to resume from (0: from scratch)
    revalidate: list[int]  # validation points <= start whose scores changed
    first_changed_step: int | None
    folders: list[FolderRegrade]

    @property
    def unchanged(self) -> bool:
        return self.start == self.latest and not self.revalidate


def plan_resume(
    root: Path,
    latest: int,
    checkpoints: list[int],
    validated: list[int],
    regrade,  # Path -> FolderRegrade
) -> ResumePlan:
    """Re-grade the journal of steps < `latest` and the validation points <= `latest`, and pick
    the checkpoint to resume from: the last one (of `checkpoints`, which exist) before the
    first changed step, lowered below any changed (or missing) validation point that has no
    checkpoint."""
    steps = [regrade(step_dir(root, s)) for s in range(latest)]
    first = next((s for s, f in enumerate(steps) if f.score_changes), None)
    start = latest if first is None else max((c for c in checkpoints if c <= first), default=0)
    # A point whose journal is not whole (validation.json is written last) counts as changed: a job
    # killed after supersede moved it, or while validating it, validates it again.
    whole = [j for j in validated if j <= latest and (val_dir(root, j) / "validation.json").is_file()]
    vals = {j: regrade(val_dir(root, j)) for j in whole}
    missing = [j for j in validated if j <= latest and j not in whole]
    changed_vals = sorted({*(j for j, f in vals.items() if f.score_changes), *missing})
    while True:  # a changed point is validated again from its checkpoint; without one, resume below it
        orphan = [j for j in changed_vals if 0 < j <= start and j not in checkpoints]
        if not orphan:
            break
        start = max((c for c in checkpoints if c < min(orphan)), default=0)
    revalidate = [j for j in changed_vals if j <= start] if start > 0 else []
    return ResumePlan(latest, start, revalidate, first, [*steps, *vals.values()])


def supersede(root: Path, plan: ResumePlan, checkpoints: list[int], validated: list[int]) -> Path | None:
    """Move the work after plan.start, and the validation points to redo, to <root>.superseded-<n>/
    with a regrade.json that says why; return that folder (None when nothing moves)."""
    # Checkpoints first, latest first: a job killed half-way then resumes from a checkpoint whose
    # journal is all still in place.
    moving = [root / f"step_{c}" for c in sorted(checkpoints, reverse=True) if c > plan.start]
    moving += [step_dir(root, s) for s in range(plan.start, plan.latest)]
    # A point past the latest checkpoint (a job killed between validating and saving) is not moved:
    # the resumed job validates it again, over the same files.
    moving += [
        val_dir(root, j)
        for j in validated
        if plan.start < j <= plan.latest or j in plan.revalidate or plan.start == 0
    ]
    if not any(p.exists() for p in moving):
        return None
    # wandb only appends steps; the trainer starts a new log and replays the journal it keeps.
    moving = [p for p in [*moving, root / "wandb"] if p.exists()]
    aside = aside_path(root, "superseded")
    aside.mkdir(parents=True)
    atomic_write_json(aside / REGRADE, summary(plan))  # first: a job killed while moving leaves the why
    for p in moving:
        target = aside / p.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(p, target)
    return aside


def brief(plan: ResumePlan) -> dict:
    """The plan in one log line's fields: the summary without the changed folders."""
    return {k: v for k, v in summary(plan).items() if k != "folders"}


def summary(plan: ResumePlan) -> dict:
    """What run.json and regrade.json record of the re-grade."""
    return {
        "latest_checkpoint": plan.latest,
        "resumed_from": plan.start,
        "first_changed_step": plan.first_changed_step,
        "revalidated": plan.revalidate,
        "calls_regraded": sum(f.calls for f in plan.folders),
        "score_changes": sum(len(f.score_changes) for f in plan.folders),
        "output_changes_kept": sum(f.output_changes for f in plan.folders),
        "folders": [asdict(f) for f in plan.folders if f.score_changes or f.output_changes],
    }
