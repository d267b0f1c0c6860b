"""scripts/engine_table.py: the two engines' step metrics side by side, per step and as means,
with verl's own metrics by global step (ours is 0-based)."""

from __future__ import annotations

import importlib.util
import json

import polars as pl
import pytest

from atlas.contracts.runs import STEP_METRICS_SCHEMA
from conftest import REPO


def module():
    spec = importlib.util.spec_from_file_location("engine_table", REPO / "scripts" / "engine_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_run(path, rows):
    names = STEP_METRICS_SCHEMA.names
    table = {n: [r.get(n) for r in rows] for n in names}
    pl.DataFrame(
        table, schema=pl.Schema(pl.from_arrow(STEP_METRICS_SCHEMA.empty_table()).schema)
    ).write_parquet(path)


def test_the_table_gives_each_step_and_the_mean_of_both_engines(tmp_path, capsys):
    write_run(
        tmp_path / "local.parquet",
        [
            {"run": "r", "step": 1, "timing_s/step": 50.0, "rollout/importance_ratio_raw_outside": 0.25},
            {"run": "r", "step": 0, "timing_s/step": 40.0, "rollout/importance_ratio_raw_outside": 0.5},
        ],
    )
    write_run(
        tmp_path / "verl.parquet", [{"run": "r", "step": 0, "timing_s/step": 90.0}, {"run": "r", "step": 1}]
    )
    metrics = tmp_path / "metrics_0.jsonl"
    metrics.write_text(
        "\n".join(json.dumps({"step": g, "data": {"perf/throughput": 1000.0 * g}}) for g in (1, 2)) + "\n"
    )
    args = ["--local", str(tmp_path / "local.parquet"), "--verl", str(tmp_path / "verl.parquet")]
    assert module().main([*args, "--verl-metrics", str(metrics)]) == 0
    lines = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines()}
    # local step 0, step 1, verl step 0, step 1, local mean, verl mean
    assert lines["| step seconds"] == "| step seconds | 40.0 | 50.0 | 90.0 |  | 45.0 | 90.0 |"
    assert lines["| share outside [0.9, 1.1] (raw)"].endswith("| 50.00% | 25.00% |  |  | 37.50% |  |")
    assert lines["| verl perf/throughput (tokens/s per GPU)"].endswith("|  |  | 1,000 | 2,000 |  | 1,500 |")


def test_a_file_that_is_not_step_metrics_is_named(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(SystemExit, match="x.parquet: not a step_metrics.parquet"):
        module().main(["--local", str(bad), "--verl", str(bad)])
