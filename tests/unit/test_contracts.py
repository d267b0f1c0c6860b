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
