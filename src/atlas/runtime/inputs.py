"""Question inputs for rollouts: rows of val.parquet / train.parquet and their LCB tests."""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from atlas.contracts.parquet import read_table
from atlas.data.schema import TestCase
from atlas.hashing import is_bookkeeping
from atlas.stage import stage_parser


def rollout_parser(description: str) -> argparse.ArgumentParser:
    """A rollout stage's command line: the config slice and output, the data and the model."""
    parser = stage_parser(description)
    parser.add_argument("--val", required=True, type=Path, help="results/data/val.parquet")
    parser.add_argument("--tests", required=True, type=Path, help="results/data/tests.parquet")
    parser.add_argument("--model", required=True, type=Path, help="the base model folder")
    return parser


def model_files(model_dir: str | Path) -> list[Path]:
    """The model folder's files, for a manifest's inputs: a rebuilt model makes the run stale."""
    return sorted(p for p in Path(model_dir).rglob("*") if p.is_file() and not is_bookkeeping(p.name))


def training_parser(description: str) -> argparse.ArgumentParser:
    """A training stage's command line: a rollout stage's, plus the schedule, checkpoints, snapshot."""
    p = rollout_parser(description)
    p.add_argument("--train", required=True, type=Path, help="results/data/train.parquet")
    p.add_argument("--checkpoints", required=True, type=Path, help="results/checkpoints/<run>")
    p.add_argument("--snapshot", type=Path, help="run folder whose critic is the frozen potential")
    return p


def training_inputs(args) -> list[Path]:
    """The files a training stage reads, for its fingerprint and manifest."""
    snapshot = [args.snapshot / "checkpoints.json"] if args.snapshot else []
    return [args.train, args.val, args.tests, *model_files(args.model), *snapshot]


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
