#!/usr/bin/env python
"""Runtime benchmark on CPU with the tiny model: prints a table and writes JSON.

    python scripts/bench_runtime.py [--model results/models/tiny] [--out results/bench/runtime_cpu.json]

Measures
  - rollout tokens/s of HFEngine with the call grammar and unconstrained, same batch and seeds
    (the unconstrained rows run to the same number of steps as the constrained ones);
  - grammar mask time per generated token (batched fill + apply, per step divided by live rows);
  - graded programs per second (the fixture reference solutions on all their tests, bounded pool).
Needs results/models/tiny (snakemake --cores all results/models/tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from atlas.config import GraderConfig, RuntimeConfig
from atlas.data.lcb import read_lcb
from atlas.graders.lcb import grade_many
from atlas.hashing import atomic_write_json
from atlas.runtime.engine import GenerationRequest
from atlas.runtime.session import load_runtime
from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools

REPO = Path(__file__).resolve().parent.parent


def rollout(rt, constrained: bool, batch: int, repeats: int, max_new: int) -> dict:
    rt.engine.constrained = constrained
    code = CodeBounds(64, 8)
    rates, mask_per_token, tokens = [], [], 0
    for r in range(repeats):
        requests = []
        for i in range(batch):
            tools = gpqa_tools(code) if i % 2 == 0 else lcb_tools(code)
            prompt = rt.chat_ids(
                [{"role": "user", "content": f"Question {i}: solve it."}], [t.spec() for t in tools.values()]
            )
            requests.append(GenerationRequest(prompt, rt.grammars.get(tools), max_new, seed=1000 * r + i))
        t0 = time.perf_counter()
        gens = rt.engine.generate(requests)
        dt = time.perf_counter() - t0
        n = sum(len(g.token_ids) for g in gens)
        tokens += n
        rates.append(n / dt)
        mask_per_token.append(sum(g.mask_s for g in gens) / n)
    rt.engine.constrained = True
    return {
        "tokens": tokens,
        "tokens_per_s": statistics.median(rates),
        "mask_us_per_token": statistics.median(mask_per_token) * 1e6,
    }


def grading(workers: int, rounds: int) -> dict:
    questions = read_lcb(REPO / "resources/fixtures/lcb_train.jsonl", "train")
    solutions = json.loads((REPO / "resources/fixtures/lcb_solutions.json").read_text())
    jobs = [
        (solutions[q.record_id], q.public_tests + q.private_tests, q.func_name) for q in questions
    ] * rounds
    cfg = GraderConfig(workers=workers, test_timeout_s=6.0, program_timeout_s=30.0)
    t0 = time.perf_counter()
    verdicts = grade_many(jobs, cfg=cfg)
    dt = time.perf_counter() - t0
    return {
        "programs": len(jobs),
        "tests": sum(v.total for v in verdicts),
        "passed_programs": sum(v.status == "passed" for v in verdicts),
        "programs_per_s": len(jobs) / dt,
        "tests_per_s": sum(v.total for v in verdicts) / dt,
        "workers": workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "results/models/tiny")
    parser.add_argument("--out", type=Path, default=REPO / "results/bench/runtime_cpu.json")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not args.model.is_dir():
        sys.exit(f"{args.model} not found; build it with: snakemake --cores all results/models/tiny")

    torch.manual_seed(0)
    rt = load_runtime(args.model, RuntimeConfig(max_generation_tokens=1024))
    constrained = rollout(rt, True, args.batch, args.repeats, 1024)
    steps = max(1, constrained["tokens"] // (args.batch * args.repeats))
    unconstrained = rollout(rt, False, args.batch, args.repeats, steps)
    grade = grading(workers=2, rounds=2)

    result = {
        "device": "cpu",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "model": str(args.model),
        "batch": args.batch,
        "rollout_constrained": constrained,
        "rollout_unconstrained": unconstrained,
        "grammar_speed_ratio": constrained["tokens_per_s"] / unconstrained["tokens_per_s"],
        "grading": grade,
    }
    atomic_write_json(args.out, result)
    rows = [
        ("rollout tok/s, grammar on", f"{constrained['tokens_per_s']:.1f}"),
        ("rollout tok/s, grammar off", f"{unconstrained['tokens_per_s']:.1f}"),
        ("ratio on / off", f"{result['grammar_speed_ratio']:.3f}"),
        ("mask time per token (us)", f"{constrained['mask_us_per_token']:.1f}"),
        ("graded programs/s (2 workers)", f"{grade['programs_per_s']:.2f}"),
        ("graded tests/s (2 workers)", f"{grade['tests_per_s']:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'metric':<{width}}  value")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
