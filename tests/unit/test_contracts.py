"""The files stages write follow their declared schemas (atlas.contracts), and the writers refuse
a column their contract does not declare."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from atlas.contracts import runs
from atlas.contracts.protocol import PINNED_COUNTS
from atlas.report.tables import METRIC_MEANINGS


def polars_schema(schema: pa.Schema) -> pl.Schema:
    return pl.from_arrow(schema.empty_table()).schema


def test_a_column_outside_the_contract_is_an_error_naming_it():
    with pytest.raises(
        ValueError, match=r"step metrics: columns \['critic/new_thing'\] are not in its schema"
    ):
        runs.table(
            [{"run": "a", "step": 0, "critic/new_thing": 1.0}], runs.STEP_METRICS_SCHEMA, "step metrics"
        )


def test_absent_metrics_are_null_columns_of_the_declared_types():
    frame = runs.table([{"run": "a", "step": 3, "actor/pg_loss": -0.5}], runs.STEP_METRICS_SCHEMA, "m")
    assert frame.columns == ["run", "step", *runs.STEP_METRICS]
    assert frame.schema == polars_schema(runs.STEP_METRICS_SCHEMA)
    row = frame.row(0, named=True)
    assert row["step"] == 3 and row["actor/pg_loss"] == -0.5 and row["critic/vf_loss"] is None


def test_every_metric_has_a_meaning_and_counts_are_pinned_once():
    assert tuple(METRIC_MEANINGS) == runs.STEP_METRICS
    assert {f"protocol/{k}" for k in PINNED_COUNTS} <= set(runs.STEP_METRICS)
    assert PINNED_COUNTS == ("episodes", "completed", "generations", "records", "calls", "violations")


def test_a_parquet_file_reads_whole_and_a_broken_one_is_named(tmp_path):
    import pyarrow.parquet as pq

    from atlas.contracts.parquet import read_table

    table = pa.table({"question_uid": ["a", "b"], "score": [1.0, None]})
    pq.write_table(table, tmp_path / "t.parquet", compression="zstd")
    assert read_table(tmp_path / "t.parquet").equals(table)
    whole = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])  # a killed copy
    with pytest.raises(pa.ArrowInvalid, match=r"cut\.parquet: "):
        read_table(tmp_path / "cut.parquet")
    with pytest.raises(FileNotFoundError, match=r"gone\.parquet"):
        read_table(tmp_path / "gone.parquet")


def test_reading_a_parquet_file_does_not_import_pyarrow_dataset(tmp_path):
    import subprocess
    import sys

    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "t.parquet")
    code = (
        "import sys; from atlas.contracts.parquet import read_table; "
        f"read_table({str(tmp_path / 't.parquet')!r}); print('pyarrow.dataset' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
