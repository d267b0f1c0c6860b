#!/usr/bin/env python
"""The two training engines side by side, from the step metrics of the same run under each.

    python scripts/engine_table.py --local local/training_smoke.parquet \
        --verl verl/training_smoke.parquet [--verl-metrics verl/training_smoke/metrics_*.jsonl]

Each parquet is a run folder's step_metrics.parquet (results/runs/<run>/), one made with
`training.engine: local`, the other with `verl`, on the same config and GPU. Prints a Markdown
table: per step, then the mean of the steps, of the step, rollout and update seconds, the rollout
tokens and tokens/s, the peak memory, and the rollout-vs-trainer drift (atlas.rl.drift). The
verl metrics files (verl's own file logger, one per launch) add verl's `perf/throughput` and
`training/rollout_probs_diff_*`, which compare probabilities, not log-probs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

from atlas.verl.convert import VerlOutputError, read_metrics

ROWS = [
    ("step seconds", "timing_s/step", "{:.1f}"),
    ("rollout seconds", "timing_s/gen", "{:.1f}"),
    ("rollout tokens", "perf/rollout_tokens", "{:,.0f}"),
    ("rollout tokens/s", "perf/rollout_tokens_per_s", "{:,.0f}"),
    ("old log-prob seconds", "timing_s/old_log_prob", "{:.1f}"),
    ("critic update seconds", "timing_s/update_critic", "{:.1f}"),
    ("actor update seconds", "timing_s/update_actor", "{:.1f}"),
    ("peak CUDA memory allocated, GiB", "perf/max_memory_allocated_gb", "{:.1f}"),
    ("log-prob gap, mean", "rollout/logprob_gap_mean", "{:.4f}"),
    ("log-prob gap, max", "rollout/logprob_gap_max", "{:.3f}"),
    ("importance ratio, mean (masked)", "rollout/importance_ratio_mean", "{:.4f}"),
    ("share outside [0.9, 1.1] (masked)", "rollout/importance_ratio_outside", "{:.2%}"),
    ("importance ratio, mean (raw)", "rollout/importance_ratio_raw_mean", "{:.4f}"),
    ("share outside [0.9, 1.1] (raw)", "rollout/importance_ratio_raw_outside", "{:.2%}"),
    ("episodes", "protocol/episodes", "{:.0f}"),
    ("protocol violations", "protocol/violations", "{:.0f}"),
]
VERL_ROWS = [
    ("verl perf/throughput (tokens/s per GPU)", "perf/throughput", "{:,.0f}"),
    ("verl training/rollout_probs_diff_mean", "training/rollout_probs_diff_mean", "{:.5f}"),
    ("verl training/rollout_probs_diff_max", "training/rollout_probs_diff_max", "{:.4f}"),
]


def cell(fmt: str, value) -> str:
    return "" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--local", type=Path, required=True, help="step_metrics.parquet of the local engine's run"
    )
    ap.add_argument("--verl", type=Path, required=True, help="step_metrics.parquet of the verl run")
    ap.add_argument(
        "--verl-metrics", type=Path, nargs="*", default=[], help="verl's metrics_<n>.jsonl, in launch order"
    )
    args = ap.parse_args(argv)
    runs = {}
    for engine, path in (("local", args.local), ("verl", args.verl)):
        try:
            runs[engine] = pl.read_parquet(path).sort("step").to_dicts()
        except (OSError, pl.exceptions.PolarsError) as err:
            sys.exit(f"{path}: not a step_metrics.parquet ({err})")
    try:
        extra = read_metrics(args.verl_metrics)
    except VerlOutputError as err:
        sys.exit(str(err))
    for k, row in enumerate(runs["verl"]):  # verl's global step g is our step g - 1
        row.update({key: extra.get(k + 1, {}).get(key) for _, key, _ in VERL_ROWS})
    steps = max(len(r) for r in runs.values())
    head = ["", *(f"{e} step {k}" for e in runs for k in range(steps)), *(f"{e} mean" for e in runs)]
    print("| " + " | ".join(head) + " |")
    print("|---" + "|---:" * (len(head) - 1) + "|")
    for label, key, fmt in ROWS + (VERL_ROWS if args.verl_metrics else []):
        cells = []
        for rows in runs.values():
            cells += [cell(fmt, rows[k].get(key)) if k < len(rows) else "" for k in range(steps)]
        for rows in runs.values():
            values = [r.get(key) for r in rows if r.get(key) is not None]
            cells.append(cell(fmt, sum(values) / len(values)) if values else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
