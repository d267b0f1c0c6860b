#!/usr/bin/env python
"""Update benchmark: the trainer's own PPO update (atlas.rl.ppo.ppo_update) at a real shape.

    python scripts/bench_update.py --shape 8b --out update_8b.json

The policy is the trainer's (ActorCritic, actor and critic LoRA r64/a128 on all linear layers)
over atlas.model.shapes' random-init Qwen3 of the shape, vocab 151,936, bf16 on the GPU, built
by atlas.rl.serving.policy_on with what `auto` turns on there: gradient checkpointing, padding
removal with the chunked head, Liger kernels and fused LoRA. The batch is atlas.rl.synthetic's
(`--rows` x `--row-tokens`), cut into micro-batches by training.ppo.micro_batch_tokens. Each repeat is one
ppo_update: the forward passes and GAE, then the critic and actor updates (one optimizer step
each); the table gives the actor update's seconds from the update's own timing_s/update_actor.

MFU = 8 x P x tokens / seconds / 792 TFLOP/s, P the base model's parameters, 792 the bf16
8192^3 matmul rate measured on the H200 (the convention of ../docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from atlas.config.training import PPOConfig, TrainingConfig
from atlas.model.liger import wanted
from atlas.model.shapes import SYNTHETIC_VOCAB, base_parameters, shape_model
from atlas.rl.checkpoint import save_compact
from atlas.rl.ppo import make_optimizers, make_schedulers, ppo_update
from atlas.rl.serving import policy_on
from atlas.rl.synthetic import synthetic_batch

PEAK_TFLOPS = 792.0


class _Vocab:  # the head's width without training a 151,936-token BPE: the weights are random anyway
    def __len__(self) -> int:
        return SYNTHETIC_VOCAB

    def convert_tokens_to_ids(self, token: str) -> int:
        return 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8b")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--row-tokens", type=int, default=2048)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--liger", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    liger = {"auto": "auto", "true": True, "false": False}[args.liger]
    ppo = PPOConfig(micro_batch_tokens=args.micro_batch_tokens, liger=liger, kl_mode="loss")
    training = TrainingConfig(
        responses_per_question=8, lora_rank=args.lora, lora_alpha=2 * args.lora, ppo=ppo
    )
    base = shape_model(args.shape, _Vocab(), device="cuda")
    params = base_parameters(base)
    ac = policy_on(base, training, seed=0, device="cuda")  # the trainer's policy on a GPU
    optimizers = make_optimizers(ac, ppo)
    tokens = args.rows * args.row_tokens
    seconds, peak, metrics = [], 0.0, {}
    for k in range(args.repeats + 1):  # the first is the warm-up (Triton and cuBLAS set-up)
        batch = synthetic_batch(args.rows, args.row_tokens, base.config.vocab_size, seed=k, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        metrics = ppo_update(ac, batch, optimizers, ppo, temperature=1.0)
        peak = max(peak, torch.cuda.max_memory_allocated() / 2**30)
        if k:
            seconds.append(metrics["timing_s/update_actor"])
        print(
            f"repeat {k}: "
            + " ".join(f"{n}={metrics[n]:.3f}" for n in sorted(metrics) if n.startswith("timing_s/")),
            flush=True,
        )
    t = time.perf_counter()  # the compact checkpoint the trainer saves after a step
    folder = save_compact(tempfile.mkdtemp(), 1, ac, optimizers, make_schedulers(optimizers, ppo, 1), {})
    save_s, save_bytes = (
        time.perf_counter() - t,
        sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
    )
    s = statistics.median(seconds)
    tflops = 8 * params * tokens / s / 1e12
    result = dict(
        command=" ".join(["scripts/bench_update.py", *sys.argv[1:]]), device=torch.cuda.get_device_name()
    )
    result |= dict(torch=torch.__version__, shape=args.shape, base_parameters=params, tokens=tokens)
    result |= dict(micro_batch_tokens=args.micro_batch_tokens, liger=wanted(ppo.liger, cuda=True))
    result |= dict(update_actor_s=seconds, median_s=s, model_tflops=tflops, mfu=tflops / PEAK_TFLOPS)
    result |= dict(
        peak_memory_gb=peak, checkpoint_save_s=save_s, checkpoint_bytes=save_bytes, last_metrics=metrics
    )
    print(
        f"{args.shape} actor update {s:.3f} s  {tokens / s:,.0f} tok/s  {tflops:.0f} TFLOP/s  MFU {tflops / PEAK_TFLOPS:.1%}  peak {peak:.1f} GiB  "
        f"checkpoint {save_bytes / 1e9:.2f} GB in {save_s:.2f} s"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
