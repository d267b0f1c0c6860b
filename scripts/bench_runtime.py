#!/usr/bin/env python
"""Runtime benchmark on CPU with the tiny model: prints a table and writes JSON.

    python scripts/bench_runtime.py [--model results/models/tiny] [--out results/bench/runtime_cpu.json]

Measures rollout tokens/s of the runtime's engine (HFEngine on CPU) with the call grammar and
unconstrained, on the same batch and seeds (atlas.runtime.synthetic's requests; the unconstrained
rows run to the number of steps the constrained ones took), and the grammar mask time per
generated token (batched fill + apply, per step divided by live rows). Grading throughput is
scripts/bench_graders.py's. Needs results/models/tiny (snakemake --cores all results/models/tiny).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from atlas.config.runtime import RuntimeConfig
from atlas.hashing import atomic_write_json
from atlas.runtime.session import load_runtime
from atlas.runtime.synthetic import tool_requests
from atlas.runtime.tools import CodeBounds


def rollout(rt, constrained: bool, batch: int, repeats: int, max_new: int) -> dict:
    rt.engine.constrained = constrained
    rates, mask_per_token, tokens = [], [], 0
    for r in range(repeats):
        reqs = tool_requests(
            rt, questions=batch, samples=1, max_new=max_new, bounds=CodeBounds(64, 8), seed=1000 * r
        )
        t0 = time.perf_counter()
        gens = rt.engine.generate(reqs)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("results/models/tiny"))
    parser.add_argument("--out", type=Path, default=Path("results/bench/runtime_cpu.json"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not args.model.is_dir():
        sys.exit(f"{args.model} not found; build it with: snakemake --cores all results/models/tiny")

    torch.manual_seed(0)
    rt = load_runtime(args.model, RuntimeConfig(max_generation_tokens=1024))
    on = rollout(rt, True, args.batch, args.repeats, 1024)
    off = rollout(rt, False, args.batch, args.repeats, max(1, on["tokens"] // (args.batch * args.repeats)))
    result = {
        "device": "cpu",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "model": str(args.model),
        "batch": args.batch,
        "rollout_constrained": on,
        "rollout_unconstrained": off,
        "grammar_speed_ratio": on["tokens_per_s"] / off["tokens_per_s"],
    }
    atomic_write_json(args.out, result)
    rows = [
        ("rollout tok/s, grammar on", f"{on['tokens_per_s']:.1f}"),
        ("rollout tok/s, grammar off", f"{off['tokens_per_s']:.1f}"),
        ("ratio on / off", f"{result['grammar_speed_ratio']:.3f}"),
        ("mask time per token (us)", f"{on['mask_us_per_token']:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'metric':<{width}}  value")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
