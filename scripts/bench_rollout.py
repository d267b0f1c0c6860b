#!/usr/bin/env python
"""Rollout benchmark: the training runtime's engine on the report's batch, LoRA served merged or not.

    python scripts/bench_rollout.py --shape 1.7b --tokenizer .gpu/tokenizer --out $OUT/rollout.json

atlas.model.shapes' random-init Qwen3 of the shape over the synthetic 151,936-token tokenizer
(built in `--tokenizer` if missing), bf16, in the runtime the trainer makes (make_runtime:
StaticEngine, compiled, grammar-constrained). Arms: `base` (no LoRA), `adapters` (the actor LoRA
through peft's layers), `merged` (the same actor folded into a copy, as training serves it). The
batch is atlas.runtime.synthetic's 32 questions x 8 samples, `--new` tokens each; after the runs
the merged model's log-probs are compared with the adapters' on the generated rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from atlas.config import RuntimeConfig, TrainingConfig
from atlas.model.shapes import shape_model, synthetic_tokenizer
from atlas.rl.step import policy_on, rollout_model
from atlas.runtime.session import make_runtime
from atlas.runtime.synthetic import tool_requests
from atlas.runtime.tools import CodeBounds

CFG = RuntimeConfig(max_text_tokens=48, max_code_run=64, max_code_escapes=8, max_generation_tokens=1024)
BOUNDS = CodeBounds.of(CFG)


def timed_generate(rt, reqs, repeats: int) -> dict:
    rt.engine.generate(reqs)  # compile and capture
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        gens = rt.engine.generate(reqs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    seconds, tokens = sorted(times)[len(times) // 2], sum(len(g.token_ids) for g in gens)
    return dict(
        seconds=seconds, tokens=tokens, tokens_per_s=tokens / seconds, timing=rt.engine.last_timing
    ), gens


def logprob_gap(ac, merged, reqs, gens, rows: int = 8) -> float:
    """Max |log p_merged - log p_adapters| of the generated tokens (raw distribution), bf16."""
    gap = 0.0
    with torch.no_grad():
        for r, g in list(zip(reqs, gens, strict=True))[:rows]:
            ids = torch.tensor([list(r.prompt_ids) + g.token_ids], device="cuda")
            n = len(g.token_ids)
            tgt = ids[0, -n:]
            a, b = ac.actor_logits(ids), merged.model(input_ids=ids).logits
            a, b = (x[0, -n - 1 : -1].float().log_softmax(-1).gather(-1, tgt[:, None]) for x in (a, b))
            gap = max(gap, (a - b).abs().max().item())
    return gap


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in dict(shape="1.7b", arms="base,merged", lora=64, questions=32, samples=8).items():
        p.add_argument(f"--{name}", type=type(default), default=default)
    for name, default in dict(new=128, repeats=2).items():
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--tokenizer", type=Path, default=Path(".gpu/tokenizer"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not (args.tokenizer / "tokenizer.json").exists():
        synthetic_tokenizer().save_pretrained(args.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    base = shape_model(args.shape, tokenizer, device="cuda")
    training = TrainingConfig(
        responses_per_question=args.samples, lora_rank=args.lora, lora_alpha=2 * args.lora
    )
    ac = merged = None
    results = dict(command=" ".join(["scripts/bench_rollout.py", *sys.argv[1:]]), torch=torch.__version__)
    results |= dict(device=torch.cuda.get_device_name(), shape=args.shape, vocab=len(tokenizer), arms={})
    results |= dict(new_tokens=args.new, batch=args.questions * args.samples, lora_rank=args.lora)
    for arm in args.arms.split(","):
        if arm != "base" and ac is None:
            ac = policy_on(base, training, seed=0, device="cuda")  # the trainer's policy
            with torch.no_grad():  # a trained-looking actor: B off zero, so the merge matters
                for t in (t for name, t in ac.trainable("actor").items() if "lora_B" in name):
                    t.normal_(0, 1e-3)
            merged = rollout_model(ac, training, "cuda")  # what the trainer serves (merged_rollouts: auto)
        model = {"base": base, "adapters": ac and ac.peft, "merged": merged and merged.model}[arm]
        rt = make_runtime(model, tokenizer, CFG)
        reqs = tool_requests(
            rt, questions=args.questions, samples=args.samples, max_new=args.new, bounds=BOUNDS
        )
        row, gens = timed_generate(rt, reqs, args.repeats)
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        if arm == "merged":
            t = time.perf_counter()
            merged.refresh()
            torch.cuda.synchronize()
            row["refresh_s"] = time.perf_counter() - t
            row["logprob_gap_vs_adapters"] = logprob_gap(ac, merged, reqs, gens)
        results["arms"][arm] = row
        extra = " ".join(f"{k}={row[k]:.4g}" for k in ("refresh_s", "logprob_gap_vs_adapters") if k in row)
        print(
            f"{arm:10s} {row['tokens_per_s']:10.0f} tok/s  {row['seconds']:.2f} s  {row['tokens']} tokens {extra}"
        )
        del rt
    if "base" in results["arms"]:
        for arm, row in results["arms"].items():
            row["vs_base"] = row["tokens_per_s"] / results["arms"]["base"]["tokens_per_s"]
            print(f"{arm:10s} {row['vs_base']:.3f} of base tokens/s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
