"""Data-parallel PPO update step under torchrun: the same global batch on N ranks, gradients averaged.

    torchrun --standalone --nproc-per-node 2 scripts/bench_gpu_dp.py --shape 1.7b --out OUT/dp_2.json
    torchrun --standalone --nproc-per-node 1 scripts/bench_gpu_dp.py --shape 1.7b --out OUT/dp_1.json

Every rank builds the same policy (random-init Qwen3 of the shape, LoRA actor and critic, the
update path of bench_gpu_perf: packed rows, chunked head, fused bf16 LoRA, Liger kernels on CUDA)
and the same synthetic global batch (equal-length rows), and takes rows rank, rank + N, ... Each
phase of bench_gpu_perf.ppo_step (old log-prob, reference, values, GAE, critic update, actor update)
runs on the rank's rows; before each optimizer step the trainable gradients are averaged over the
ranks in one flat all-reduce (NCCL on GPUs, gloo on CPU), so the step is the single-process step
on the whole batch (equal rows per rank: the mean of the ranks' token means is the global one).
Each rank writes its phase times and peak memory; rank 0 adds the parameter digest agreement.
Generation is left out: each rank would generate its own rows with no communication.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_perf import Phases, Policy, ppo_step, synthetic_batch, warm_up  # noqa: E402
from bench_gpu_rollout import SHAPES, VOCAB, build_model  # noqa: E402
from bench_gpu_update import apply_liger  # noqa: E402

from atlas.config import PPOConfig, TrainingConfig  # noqa: E402
from atlas.hashing import atomic_write_json  # noqa: E402
from atlas.model.fused_lora import fused_lora  # noqa: E402
from atlas.model.policy import ActorCritic  # noqa: E402
from atlas.rl.packing import packed_attention  # noqa: E402
from atlas.rl.ppo import make_optimizers  # noqa: E402


class DataParallelPolicy(Policy):
    """bench_gpu_perf's Policy with the gradients averaged over the ranks before clipping."""

    def sync_grads(self, params: list[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


class NoSampler:
    phase = ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    p.add_argument("--tokenizer", type=Path, default=Path(".gpu/tokenizer"))
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--rows", type=int, default=16, help="rows of the global batch")
    p.add_argument("--row-tokens", type=int, default=2048)
    p.add_argument("--prompt", type=int, default=512, help="tokens of a row before the sampled ones")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--micro-tokens", type=int, default=32_768)
    p.add_argument("--out", type=Path, required=True, help="JSON of this world size (rank 0 writes it)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.rows % world:
        raise SystemExit(f"--rows {args.rows} must split evenly over {world} ranks")
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    base = build_model(tokenizer, args.shape, torch.bfloat16 if cuda else torch.float32, 0, device)
    training = TrainingConfig(
        responses_per_question=8, lora_rank=args.lora, lora_alpha=2 * args.lora, lora_targets="all-linear"
    )
    ac = ActorCritic(base, training, seed=0).to(device).eval()
    ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ppo = PPOConfig()
    optimizers = make_optimizers(ac, ppo)
    policy = DataParallelPolicy(ac, ppo, 1.0, args.micro_tokens)
    phases = Phases(NoSampler(), cuda)
    batch = synthetic_batch(args.rows, args.row_tokens, args.prompt, device, seed=5)
    mine = batch.rows(list(range(rank, args.rows, world)))
    steps = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(packed_attention(ac.peft))
        stack.enter_context(fused_lora(ac.peft))
        if cuda:
            apply_liger(base)
        warm_up(policy, optimizers, device)
        for k in range(1, args.steps + 1):
            dist.barrier()
            steps.append(ppo_step("dp_step", k, policy, mine, optimizers, ppo, phases, rollout=False))
    digest = hashlib.sha256()
    for role in ("actor", "critic"):
        for _, t in sorted(ac.trainable(role).items()):
            digest.update(t.detach().float().cpu().numpy().tobytes())
    record = {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "rows_on_this_rank": mine.input_ids.shape[0],
        "tokens_on_this_rank": int(mine.attention.sum()),
        "phases": phases.rows,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "parameter_digest": digest.hexdigest(),
        "grad_norms": [{r: s[r]["grad_norm"] for r in ("actor", "critic")} for s in steps],
    }
    everyone: list[dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(everyone, record)
    dist.destroy_process_group()
    if rank == 0:
        atomic_write_json(
            args.out,
            {
                "command": f"torchrun --nproc-per-node {world} {' '.join(sys.argv)}",
                "shape": f"qwen3 {args.shape} v{VOCAB} lora r{args.lora}",
                "global_rows": args.rows,
                "row_tokens": args.row_tokens,
                "synthetic": "random-init weights, random token rows scored under random bitmasks",
                "digests_agree_across_ranks": len({r["parameter_digest"] for r in everyone}) == 1,
                "ranks": everyone,
            },
        )
        print(
            json.dumps({"world": world, "digests_agree": len({r["parameter_digest"] for r in everyone}) == 1})
        )


if __name__ == "__main__":
    main()
