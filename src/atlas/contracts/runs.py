"""The derived tables of a run folder, and the step-metric catalogue, as fixed pyarrow schemas.
The writers (atlas.rl.journal, the dose step) build their tables with `table()`, so a column
outside its contract is an error, not a silent new column. (Full validation's answers are
atlas.contracts.answers': editing one never reruns the other's writers.)

    results/runs/<run>/step_metrics.parquet      STEP_METRICS_SCHEMA (the dose step: DOSE_STEP_...)
    results/runs/<run>/call_advantages.parquet   CALL_ADVANTAGES_SCHEMA (the dose step: DOSE_CALL_...)
    results/runs/<run>/validation.parquet        VALIDATION_CURVE_SCHEMA

The metric names are verl's where verl has one. What each means is documented with the report's
columns (atlas.report.tables), so editing a description reruns the report alone.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from atlas.contracts.parquet import arrow_table

# The step metrics every training step writes, in column order. Measured columns (timing_s/*,
# perf/*) differ run to run; every other metric is reproducible.
STEP_METRICS: tuple[str, ...] = (
    "training/global_step",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "score/gpqa/mean",
    "score/lcb/mean",
    "completed/gpqa",
    "completed/lcb",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "critic/values/mean",
    "critic/values/max",
    "critic/values/min",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "critic/lr",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "rollout/logprob_gap_mean",
    "rollout/logprob_gap_max",
    "rollout/importance_ratio_mean",
    "rollout/importance_ratio_outside",
    "rollout/importance_ratio_raw_mean",
    "rollout/importance_ratio_raw_outside",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "prompt_length/mean",
    "turns/mean",
    "protocol/episodes",
    "protocol/completed",
    "protocol/generations",
    "protocol/records",
    "protocol/calls",
    "protocol/violations",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/gen_model",
    "timing_s/gen_tools",
    "timing_s/potential",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "timing_s/adv",
    "timing_s/update_critic",
    "timing_s/update_actor",
    "timing_s/save_checkpoint",
    "perf/rollout_tokens",
    "perf/rollout_tokens_per_s",
    "perf/cpu_memory_used_gb",
    "perf/max_memory_allocated_gb",
)

STEP_METRICS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step", pa.int64()),
        *(pa.field(m, pa.float64()) for m in STEP_METRICS),
    ]
)
DOSE_STEP_METRICS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("dose", pa.float64()),
        *(pa.field(m, pa.float64()) for m in STEP_METRICS),
    ]
)

# One row per (step, turn, tool): the advantage at those calls' action tokens (null under verl,
# whose trainer keeps values and advantages to itself), mean reward, score and potential delta.
CALL_ADVANTAGES_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("dose", pa.float64()),
        pa.field("turn", pa.int64()),
        pa.field("tool", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("advantage_mean", pa.float64()),
        pa.field("advantage_std", pa.float64()),
        pa.field("advantage_min", pa.float64()),
        pa.field("advantage_max", pa.float64()),
        pa.field("value_mean", pa.float64()),
        pa.field("reward_mean", pa.float64()),
        pa.field("score_mean", pa.float64()),
        pa.field("potential_delta_mean", pa.float64()),
    ]
)
# The dose step adds each group's change of the mean advantage against dose 0.
DOSE_CALL_ADVANTAGES_SCHEMA = CALL_ADVANTAGES_SCHEMA.append(pa.field("advantage_mean_change", pa.float64()))

# One row per validation point and source (gpqa, lcb, all).
VALIDATION_CURVE_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("source", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("utility", pa.float64()),
        pa.field("accuracy", pa.float64()),
        pa.field("completed_fraction", pa.float64()),
    ]
)


def table(rows: list[dict], schema: pa.Schema, what: str) -> pl.DataFrame:
    """The same, as a polars frame (the writers write parquet with polars)."""
    return pl.from_arrow(arrow_table(rows, schema, what))
