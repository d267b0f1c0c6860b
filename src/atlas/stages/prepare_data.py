"""Data preparation stage: ordered question inputs for training and validation.

Reads the GPQA CSV and LiveCodeBench JSONL files named by `data.gpqa.{train,val}` and
`data.lcb.{train,val}`, checks them (counts, duplicate ids, train/val overlap by id and by
normalised question text), draws the ordered schedule, and writes

    <out>/train.parquet   one row per schedule slot (step, position, question), TRAIN_SCHEMA
    <out>/val.parquet     one row per validation question, VAL_SCHEMA
    <out>/tests.parquet   one row per LiveCodeBench test, TESTS_SCHEMA
    <out>/MANIFEST.json

Every check runs before the first byte is written, and each file is replaced atomically.

    python -m atlas.stages.prepare_data --config-slice '{"data": ..., "schedule": ...}' --out results/data
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from atlas.config.data import DataConfig, DataSlice
from atlas.contracts.questions import TESTS_SCHEMA, TRAIN_SCHEMA, VAL_SCHEMA
from atlas.data.gpqa import read_gpqa
from atlas.data.lcb import read_lcb
from atlas.data.schedule import build_schedule
from atlas.data.schema import DataError, Question
from atlas.hashing import atomic_path, write_manifest
from atlas.stage import code_files, log, run, stage_parser

STAGE = "data"
MODULE = "atlas.stages.prepare_data"


def read_source(data: DataConfig, source: str, split: str) -> list[Question]:
    files = getattr(data, source)
    path = getattr(files, split)
    if source == "gpqa":
        rows = read_gpqa(path, split)
    else:
        progress = lambda n: log(STAGE, f"reading {path}", problems=n)  # noqa: E731
        rows = read_lcb(path, split, data.max_private_tests_bytes, progress)
    expected = getattr(files, f"{split}_questions")
    if expected is not None and len(rows) != expected:
        raise DataError(
            path, None, f"holds {len(rows)} questions", f"{expected} (data.{source}.{split}_questions)"
        )
    log(STAGE, f"read {source} {split}", path=path, questions=len(rows))
    return rows


def read_split(data: DataConfig, split: str) -> list[Question]:
    """GPQA rows then LCB rows, each in file order."""
    return read_source(data, "gpqa", split) + read_source(data, "lcb", split)


def check_no_overlap(train: list[Question], val: list[Question]) -> None:
    """A validation question must never be trained on: match by uid and by normalised text."""
    by_uid = {q.question_uid: q for q in train}
    by_text = {q.text_sha256: q for q in train}
    for v in val:
        t = by_uid.get(v.question_uid) or by_text.get(v.text_sha256)
        if t is not None:
            how = "id" if t.question_uid == v.question_uid else "normalised question text"
            raise DataError(
                v.origin,
                None,
                f"validation question {v.question_uid} overlaps training question "
                f"{t.question_uid} ({t.origin}) by {how}",
                "disjoint training and validation sets",
            )


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def main(argv: list[str] | None = None) -> None:
    args = stage_parser(__doc__.splitlines()[0]).parse_args(argv)
    sl = DataSlice.model_validate(args.config_slice)
    data, schedule = sl.data, sl.schedule

    train = read_split(data, "train")
    val = read_split(data, "val")
    check_no_overlap(train, val)

    try:
        slots = build_schedule(
            [(q.question_uid, q.source) for q in train],
            schedule.steps,
            schedule.questions_per_step,
            schedule.seed,
            schedule.shuffle,
        )
    except ValueError as err:
        raise DataError(data.gpqa.train + " + " + data.lcb.train, None, str(err)) from None
    by_uid = {q.question_uid: q.row() for q in train}
    train_rows = [
        {"slot": s.slot, "step": s.step, "position": s.position, **by_uid[s.question_uid]} for s in slots
    ]
    val_rows = [{"position": i, **q.row()} for i, q in enumerate(val)]
    test_rows = [row for q in (*train, *val) for row in q.test_rows()]
    log(
        STAGE,
        "schedule drawn",
        steps=schedule.steps,
        slots=len(slots),
        distinct=len({s.question_uid for s in slots}),
    )

    out = args.out
    write_parquet(out / "train.parquet", train_rows, TRAIN_SCHEMA)
    write_parquet(out / "val.parquet", val_rows, VAL_SCHEMA)
    write_parquet(out / "tests.parquet", test_rows, TESTS_SCHEMA)
    inputs = [getattr(getattr(data, s), split) for s in ("gpqa", "lcb") for split in ("train", "val")]
    write_manifest(
        out,
        stage=STAGE,
        files=["train.parquet", "val.parquet", "tests.parquet"],
        inputs=inputs,
        code=code_files(MODULE),
        config=args.config_slice,
    )
    log(STAGE, "wrote", out=out, train_rows=len(train_rows), val_rows=len(val_rows), tests=len(test_rows))


if __name__ == "__main__":
    run(main)
