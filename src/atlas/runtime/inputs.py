"""Question inputs for rollouts: rows of val.parquet / train.parquet and their LCB tests, and the
files a rollout or training stage reads, as its command line names them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from atlas.contracts.parquet import read_table
from atlas.data.schema import TestCase
from atlas.hashing import is_bookkeeping


def model_files(model_dir: str | Path) -> list[Path]:
    """The model folder's files, for a manifest's inputs: a rebuilt model makes the run stale."""
    return sorted(p for p in Path(model_dir).rglob("*") if p.is_file() and not is_bookkeeping(p.name))


@dataclass(frozen=True, kw_only=True)
class RolloutInputs:
    """What a rollout stage reads: the validation questions, their tests and the base model."""

    val: Path  # results/data/val.parquet
    tests: Path  # results/data/tests.parquet
    model: Path  # the base model folder

    def files(self) -> list[Path]:
        """The files read, for a stage's manifest: a rebuilt model makes the output stale."""
        return [self.val, self.tests, *model_files(self.model)]


@dataclass(frozen=True, kw_only=True)
class TrainingInputs(RolloutInputs):
    """What a training run reads: a rollout stage's inputs, the ordered schedule and, for a frozen
    critic potential, the run folder whose critic is frozen."""

    train: Path  # results/data/train.parquet
    snapshot: Path | None = None  # results/runs/<run> of runs.<name>.snapshot_of

    def files(self) -> list[Path]:
        """The files read, for a run's fingerprint and manifest."""
        snapshot = [self.snapshot / "checkpoints.json"] if self.snapshot else []
        return [self.train, self.val, self.tests, *model_files(self.model), *snapshot]


def read_questions(path: str | Path) -> list[dict]:
    return read_table(path).to_pylist()


def read_tests(path: str | Path) -> dict[str, list[tuple[TestCase, str]]]:
    """question_uid -> [(test, "public" | "private")], public tests first, each in file order."""
    by_uid: dict[str, list[tuple[int, int, TestCase, str]]] = defaultdict(list)
    for r in read_table(path).to_pylist():
        order = 0 if r["visibility"] == "public" else 1
        by_uid[r["question_uid"]].append(
            (order, r["index"], TestCase(r["testtype"], r["input"], r["output"]), r["visibility"])
        )
    return {
        uid: [(t, vis) for _, _, t, vis in sorted(rows, key=lambda x: x[:2])] for uid, rows in by_uid.items()
    }


def smoke_slice(questions: list[dict], n: int) -> list[dict]:
    """The first n questions, half GPQA and half LCB (in val order), or all if fewer."""
    gpqa = [q for q in questions if q["source"] == "gpqa"]
    lcb = [q for q in questions if q["source"] == "lcb"]
    take_gpqa = min(len(gpqa), n - min(len(lcb), n // 2))
    return gpqa[:take_gpqa] + lcb[: n - take_gpqa]
