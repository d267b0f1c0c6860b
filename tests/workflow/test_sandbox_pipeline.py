"""The pipeline's own records: every graded call of a run of the embedded default was sandboxed."""

import os

import polars as pl
import pytest

from atlas.graders.sandbox import isolation_available, isolation_problem

PROGRAM_TOOLS = ["python", "run_tests", "submit"]


def test_every_program_the_pipeline_ran_was_sandboxed(pipeline):
    if not isolation_available():
        message = f"bubblewrap cannot start here: {isolation_problem()}"
        if os.environ.get("ATLAS_REQUIRE_ISOLATION") == "1":
            pytest.fail(message)
        pytest.skip(message)
    files = sorted((pipeline / "results" / "runs").rglob("records.parquet"))
    stages = {f.parent.name for f in files}
    assert {"smoke", "boundary"} <= stages, stages
    records = pl.concat(
        [pl.read_parquet(f, columns=["run", "source", "tool", "tool_status", "sandboxed"]) for f in files]
    )
    # Calls that ran a program: python anywhere, run_tests and submit on LCB (a GPQA submit is a letter).
    ran = records.filter(
        pl.col("tool").is_in(PROGRAM_TOOLS)
        & (pl.col("tool_status") != "refused")
        & ~((pl.col("source") == "gpqa") & (pl.col("tool") == "submit"))
    )
    assert ran.height > 0 and set(ran["tool"]) >= {"python", "submit"}
    unsandboxed = ran.filter(~pl.col("sandboxed"))
    assert unsandboxed.height == 0, unsandboxed
