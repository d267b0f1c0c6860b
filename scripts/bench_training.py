#!/usr/bin/env python
"""Training benchmark: the trainer's own steps (atlas.rl.step.train_step) by phase, and the save.

    python scripts/bench_training.py [--config config/config.yaml] [--run zero_potential] \
        [--steps 3] [--out results/bench/training.json]

Opens the run's session exactly as the training stage does (its config slice, the data and the
model the pipeline built: snakemake --cores all results/data/train.parquet results/models/<name>)
and runs `--steps` steps through train_step, then saves the compact checkpoint the stage saves.
Prints the median seconds of each timing_s/* phase the step reports and writes them as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from atlas.config.study import config_slice, load_config
from atlas.config.training import TrainSlice
from atlas.hashing import atomic_write_json
from atlas.rl.checkpoint import save_compact
from atlas.rl.step import open_session, train_step
from atlas.runtime.inputs import TrainingInputs
from atlas.stage import show_library_log

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config/config.yaml")
    ap.add_argument("--run", default="zero_potential")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "results/bench/training.json")
    args = ap.parse_args()
    cfg = load_config(args.config)
    data = REPO / "results/data"
    inputs = TrainingInputs(
        train=data / "train.parquet",
        val=data / "val.parquet",
        tests=data / "tests.parquet",
        model=REPO / "results/models" / cfg.model.name,
    )
    show_library_log()  # the step's progress lines, as the training stage shows them
    sl = TrainSlice.model_validate(config_slice(cfg, "training", args.run))
    sess = open_session(sl, inputs)
    sess.prepare_rollouts(sl.schedule.questions_per_step)
    steps = []
    for k in range(args.steps):
        t = time.perf_counter()
        _, metrics = train_step(sess, k)
        metrics["timing_s/step"] = time.perf_counter() - t
        steps.append({n: v for n, v in metrics.items() if n.startswith("timing_s/")})
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = save_compact(
            scratch, args.steps, sess.ac, sess.optimizers, sess.schedulers, {"run": args.run}
        )
        save = {"seconds": time.perf_counter() - t, "bytes": sum(f.stat().st_size for f in folder.rglob("*"))}
    median = {p: statistics.median(s[p] for s in steps) for p in sorted(steps[0])}
    atomic_write_json(
        args.out,
        {
            "config": str(args.config),
            "run": args.run,
            "steps": steps,
            "median_s": median,
            "compact_checkpoint": save,
        },
    )
    print(f"| phase ({args.run}, {args.steps} steps, median) | seconds |\n|---|---|")
    for p, v in median.items():
        print(f"| {p.removeprefix('timing_s/')} | {v:.3f} |")
    print(f"| compact checkpoint save ({save['bytes']:,} bytes) | {save['seconds']:.3f} |")


if __name__ == "__main__":
    main()
