import json

import polars as pl
import pyarrow.parquet as pq
import pytest

from atlas.config.study import config_slice, load_config
from atlas.contracts.questions import TESTS_SCHEMA, TRAIN_SCHEMA, VAL_SCHEMA
from atlas.data.schema import DataError
from atlas.hashing import verify
from atlas.stages import prepare_data
from conftest import FIXTURES, REPO, read_csv, write_csv


def slice_with(tmp_path, **files):
    """The default config's data slice, with some files swapped for broken copies."""
    s = config_slice(load_config(REPO / "config" / "config.yaml"), "data")
    for key, path in files.items():
        source, split = key.split("_")
        s["data"][source][split] = str(path)
    for source in ("gpqa", "lcb"):
        for split in ("train", "val"):
            s["data"][source][split] = str(REPO / s["data"][source][split])
    return s


def run(tmp_path, s):
    out = tmp_path / "data"
    prepare_data.main(["--config-slice", json.dumps(s), "--out", str(out)])
    return out


def test_writes_fixed_schemas_and_the_schedule(tmp_path):
    s = slice_with(tmp_path)
    out = run(tmp_path, s)
    assert pq.read_schema(out / "train.parquet").remove_metadata() == TRAIN_SCHEMA
    assert pq.read_schema(out / "val.parquet").remove_metadata() == VAL_SCHEMA
    assert pq.read_schema(out / "tests.parquet").remove_metadata() == TESTS_SCHEMA

    train = pl.read_parquet(out / "train.parquet")
    steps, per_step = s["schedule"]["steps"], s["schedule"]["questions_per_step"]
    assert train.height == steps * per_step
    assert train["slot"].to_list() == list(range(steps * per_step))
    assert (
        train.group_by("step").agg(pl.col("question_uid").n_unique())["question_uid"].to_list()
        == [per_step] * steps
    )

    val = pl.read_parquet(out / "val.parquet")
    assert val.height == 16 + 14
    assert val["position"].to_list() == list(range(30))
    assert val["source"].to_list() == ["gpqa"] * 16 + ["lcb"] * 14
    gpqa = val.filter(pl.col("source") == "gpqa").row(0, named=True)
    assert gpqa["options"][ord(gpqa["correct_letter"]) - 65] == read_csv(FIXTURES / "gpqa_val.csv")[1][0][8]

    tests = pl.read_parquet(out / "tests.parquet")
    per_q = tests.group_by("question_uid").len()
    assert per_q.height == 20 + 14 and set(per_q["len"].to_list()) == {5}
    assert set(tests["testtype"].unique().to_list()) == {"stdin", "functional"}

    assert verify(out, check_sources=False) == []


def test_overlap_by_text_stops_before_writing(tmp_path):
    # A validation question whose text differs only in case and spacing from a training one.
    header, rows = read_csv(FIXTURES / "gpqa_val.csv")
    _, train_rows = read_csv(FIXTURES / "gpqa_train.csv")
    q = header.index("Question")
    rows[3][q] = "  " + train_rows[0][q].upper().replace(" ", "   ") + "\n"
    val = tmp_path / "gpqa_val.csv"
    write_csv(val, header, rows)
    out = tmp_path / "data"
    out.mkdir()
    (out / "train.parquet").write_bytes(b"earlier output")
    with pytest.raises(DataError) as err:
        run(tmp_path, slice_with(tmp_path, gpqa_val=val))
    msg = str(err.value)
    assert msg.startswith(f"{val}:row 4: validation question gpqa:")
    assert "overlaps training question gpqa:" in msg and "by normalised question text" in msg
    assert (out / "train.parquet").read_bytes() == b"earlier output"
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet"]


def test_overlap_by_id(tmp_path):
    header, rows = read_csv(FIXTURES / "gpqa_val.csv")
    _, train_rows = read_csv(FIXTURES / "gpqa_train.csv")
    rid = header.index("Record ID")
    rows[0][rid] = train_rows[5][rid]
    val = tmp_path / "gpqa_val.csv"
    write_csv(val, header, rows)
    with pytest.raises(DataError, match=rf"overlaps training question gpqa:{train_rows[5][rid]} .* by id"):
        run(tmp_path, slice_with(tmp_path, gpqa_val=val))


def test_count_mismatch_names_the_config_key(tmp_path):
    s = slice_with(tmp_path)
    s["data"]["lcb"]["val_questions"] = 175
    with pytest.raises(DataError) as err:
        run(tmp_path, s)
    assert str(err.value).endswith("lcb_val.jsonl: holds 14 questions; expected 175 (data.lcb.val_questions)")


def test_bad_input_exits_1_with_the_message(tmp_path):
    import subprocess
    import sys

    s = slice_with(tmp_path)
    s["data"]["gpqa"]["train_questions"] = 99
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas",
            "data",
            "--config-slice",
            json.dumps(s),
            "--out",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "gpqa_train.csv: holds 24 questions; expected 99 (data.gpqa.train_questions)"
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "d").exists()
