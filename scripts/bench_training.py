#!/usr/bin/env python
"""Training benchmark on CPU with the tiny model: prints tables and writes JSON.

    python scripts/bench_training.py [--model results/models/tiny] [--data results/data] \
        [--steps 3] [--out results/bench/training_cpu.json]

Measures
  - one PPO step by phase (generation with tools and graders, potential, old log-prob, reference,
    values, advantages, critic update, actor update, compact save), through the same functions as
    the training stage (atlas.rl.rollout / ppo / checkpoint), on the embedded default's config;
  - a compact checkpoint (LoRA tensors, value head, optimizer, RNG, state) against a full one
    (every model tensor, the base included, plus the same optimizer state): bytes and save time.
Needs results/data and results/models/tiny (snakemake --cores all results/models/tiny
results/data/train.parquet).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_gpu_checkpoint import folder_bytes, full_save

from atlas.config import load_config
from atlas.hashing import atomic_write_json
from atlas.rl.checkpoint import save_compact
from atlas.rl.potentials import make_potential
from atlas.rl.ppo import make_optimizers, make_schedulers, prepare, update
from atlas.rl.rollout import collect, episode_specs, fill_records, step_questions
from atlas.rl.step import build_policy
from atlas.runtime.inputs import read_questions, read_tests
from atlas.runtime.session import make_runtime

REPO = Path(__file__).resolve().parent.parent
PHASES = [
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
    "timing_s/step",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "results/models/tiny")
    ap.add_argument("--data", type=Path, default=REPO / "results/data")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "results/bench/training_cpu.json")
    args = ap.parse_args()
    cfg = load_config(REPO / "config/config.yaml")
    training, runtime, ppo = cfg.training, cfg.runtime, cfg.training.ppo

    ac, tokenizer = build_policy(args.model, training, cfg.seed, "cpu")
    rt = make_runtime(ac.peft, tokenizer, runtime)
    optimizers = make_optimizers(ac, ppo)
    schedulers = make_schedulers(optimizers, ppo, args.steps)
    zero = make_potential("zero")
    train_rows, tests = read_questions(args.data / "train.parquet"), read_tests(args.data / "tests.parquet")
    scratch = Path(tempfile.mkdtemp(prefix="atlas-bench-"))
    steps, compact, full = [], [], []
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            specs = episode_specs(step_questions(train_rows, step), tests, training.responses_per_question)
            data = collect(
                rt,
                specs,
                runtime,
                cfg.graders,
                zero,
                gamma=ppo.gamma,
                dose=1.0,
                run="bench",
                step=step,
                seed=cfg.seed,
            )
            prep = prepare(ac, data.batch, ppo, runtime.temperature)
            fill_records(data.episodes, prep)
            m = {
                **data.timings,
                **prep.metrics,
                **update(ac, data.batch, prep, optimizers, schedulers, ppo, runtime.temperature),
            }
            t = time.perf_counter()
            path = save_compact(scratch / "compact", step + 1, ac, optimizers, schedulers, {"run": "bench"})
            m["timing_s/save_checkpoint"] = time.perf_counter() - t
            m["timing_s/step"] = time.perf_counter() - t0
            compact.append({"seconds": m["timing_s/save_checkpoint"], "bytes": folder_bytes(path)})
            t = time.perf_counter()
            full_save(scratch / f"full_{step + 1}", ac, optimizers)
            full.append(
                {"seconds": time.perf_counter() - t, "bytes": folder_bytes(scratch / f"full_{step + 1}")}
            )
            m["tokens"] = int(data.batch.attention.sum())
            m["sampled_tokens"] = int(data.batch.sampled.sum())
            steps.append({k: v for k, v in m.items() if k in PHASES or k in ("tokens", "sampled_tokens")})
            print(f"step {step}: {m['timing_s/step']:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(scratch)

    trainable = sum(p.numel() for role in ("actor", "critic") for p in ac.trainable(role).values())
    total = sum(p.numel() for p in ac.parameters())
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
        "model": str(args.model),
        "parameters": {"total": total, "trainable": trainable},
        "episodes_per_step": cfg.schedule.questions_per_step * training.responses_per_question,
        "steps": steps,
        "phase_median_s": {p: statistics.median(s[p] for s in steps) for p in PHASES},
        "checkpoint": {
            "compact": {
                "bytes": compact[-1]["bytes"],
                "seconds_median": statistics.median(c["seconds"] for c in compact),
            },
            "full": {
                "bytes": full[-1]["bytes"],
                "seconds_median": statistics.median(c["seconds"] for c in full),
            },
        },
    }
    atomic_write_json(args.out, result)

    print(
        f"\nPPO step by phase, tiny model on CPU ({result['episodes_per_step']} episodes/step, {args.steps} steps, median)"
    )
    print("| phase | seconds | share of step |\n|---|---|---|")
    step_s = result["phase_median_s"]["timing_s/step"]
    for p in PHASES:
        v = result["phase_median_s"][p]
        share = "" if p == "timing_s/step" else f"{100 * v / step_s:.1f}%"
        print(f"| {p} | {v:.3f} | {share} |")
    c, f = result["checkpoint"]["compact"], result["checkpoint"]["full"]
    print("\n| checkpoint | bytes | save seconds (median) |\n|---|---|---|")
    print(f"| compact (LoRA + head + optimizer + RNG) | {c['bytes']:,} | {c['seconds_median']:.3f} |")
    print(f"| full (all model tensors + optimizer) | {f['bytes']:,} | {f['seconds_median']:.3f} |")
    print(
        f"| ratio full / compact | {f['bytes'] / c['bytes']:.1f}x | {f['seconds_median'] / c['seconds_median']:.1f}x |"
    )
    print(f"\nparameters: {total:,} total, {trainable:,} trainable; wrote {args.out}")


if __name__ == "__main__":
    main()
