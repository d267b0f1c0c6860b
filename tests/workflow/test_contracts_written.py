"""The pipeline run writes every table under its contract (atlas.contracts)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from atlas.contracts import runs
from atlas.contracts.answers import ANSWERS_SCHEMA
from atlas.contracts.records import RECORD_SCHEMA, TRAJECTORY_SCHEMA


def polars_schema(schema: pa.Schema) -> pl.Schema:
    return pl.from_arrow(schema.empty_table()).schema


def test_the_pipeline_run_writes_its_contracts(pipeline):
    results = pipeline / "results"
    for run in ("training_smoke", "zero_potential", "frozen_potential"):
        folder = results / "runs" / run
        assert pq.read_schema(folder / "records.parquet").remove_metadata() == RECORD_SCHEMA
        assert pq.read_schema(folder / "trajectories.parquet").remove_metadata() == TRAJECTORY_SCHEMA
        for name, schema in (
            ("step_metrics", runs.STEP_METRICS_SCHEMA),
            ("call_advantages", runs.CALL_ADVANTAGES_SCHEMA),
            ("validation", runs.VALIDATION_CURVE_SCHEMA),
        ):
            assert pl.read_parquet(folder / f"{name}.parquet").schema == polars_schema(schema), (run, name)
    dose = results / "runs" / "dose_step"
    assert pl.read_parquet(dose / "step_metrics.parquet").schema == polars_schema(
        runs.DOSE_STEP_METRICS_SCHEMA
    )
    assert pl.read_parquet(dose / "call_advantages.parquet").schema == polars_schema(
        runs.DOSE_CALL_ADVANTAGES_SCHEMA
    )
    for policy in ("base", "zero_potential", "frozen_potential"):
        answers = results / "validation" / policy / "answers.parquet"
        assert pq.read_schema(answers).remove_metadata() == ANSWERS_SCHEMA
