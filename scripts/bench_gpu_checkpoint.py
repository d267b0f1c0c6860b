#!/usr/bin/env python
"""The report's checkpoint save test on one GPU: 3 steps, compact saves against full saves.

    python scripts/bench_gpu_checkpoint.py --shape 1.7b --out $OUT/checkpoint_1.7b.json

The policy of training (atlas.model.policy.ActorCritic: a random-init Qwen3 of the shape in bf16,
actor and critic LoRA r64/a128 on all linear layers, the critic's value head) with AdamW states
for both roles (one optimizer step on random gradients), then per step a compact checkpoint
(atlas.rl.checkpoint.save_compact: trainable tensors, AdamW moments, schedulers, RNG, manifest)
and a full one (every model tensor, the base too, plus the optimizer states), timed with the
device synchronised, written to --dir. Prints a table and writes JSON rows in perf_stack's shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_rollout import SHAPES, VOCAB  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def full_save(folder: Path, ac, optimizers) -> None:
    """What a checkpoint without the compact layout holds: every tensor of the model, the base too."""
    folder.mkdir(parents=True)
    tensors = {n: p.detach().contiguous() for n, p in ac.named_parameters()}
    save_file(tensors, str(folder / "model.safetensors"))
    for role, opt in optimizers.items():
        torch.save(opt.state_dict(), folder / f"optim_{role}.pt")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atlas.config import PPOConfig, TrainingConfig
    from atlas.model.policy import ActorCritic
    from atlas.rl.checkpoint import save_compact
    from atlas.rl.ppo import make_optimizers, make_schedulers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dir", type=Path, default=Path("/tmp/atlas_ckpt_bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32

    config = Qwen3Config(
        vocab_size=VOCAB,
        head_dim=128,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
        **SHAPES[args.shape],
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        base = Qwen3ForCausalLM(config).to(dtype)
    training = TrainingConfig(
        responses_per_question=8, lora_rank=args.lora, lora_alpha=2 * args.lora, lora_targets="all-linear"
    )
    ac = ActorCritic(base, training, seed=0).to(args.device)
    ppo = PPOConfig()
    optimizers = make_optimizers(ac, ppo)
    schedulers = make_schedulers(optimizers, ppo, args.steps)
    for role, opt in optimizers.items():  # AdamW states exist, as after a real update
        for param in ac.trainable(role).values():
            param.grad = torch.randn_like(param) * 1e-3
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in ac.parameters())
    trainable = sum(p.numel() for role in optimizers for p in ac.trainable(role).values())

    shutil.rmtree(args.dir, ignore_errors=True)
    rows = []
    for step in range(1, args.steps + 1):
        sync()
        t = time.perf_counter()
        folder = save_compact(args.dir / "compact", step, ac, optimizers, schedulers, {"bench": True})
        sync()
        compact_s = time.perf_counter() - t
        t = time.perf_counter()
        full_save(args.dir / f"full_{step}", ac, optimizers)
        sync()
        full_s = time.perf_counter() - t
        rows.append(
            {
                "step": step,
                "compact_s": compact_s,
                "compact_bytes": folder_bytes(folder),
                "full_s": full_s,
                "full_bytes": folder_bytes(args.dir / f"full_{step}"),
            }
        )
        print(
            f"step {step}: compact {rows[-1]['compact_bytes'] / 1e9:.2f} GB in {compact_s:.2f} s, "
            f"full {rows[-1]['full_bytes'] / 1e9:.2f} GB in {full_s:.2f} s",
            flush=True,
        )
        shutil.rmtree(args.dir / f"full_{step}")  # an 8B full checkpoint is 17 GB: keep one at a time
    shutil.rmtree(args.dir, ignore_errors=True)

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    shape = f"qwen3 {args.shape} v{VOCAB} lora r{args.lora}"
    perf = [
        {
            "source": "committed",
            "test": "checkpoint_save",
            "run": "bench",
            "device": device,
            "model_shape": shape,
            "phase": f"save_{kind}",
            "steps": len(rows),
            "seconds": statistics.median(r[f"{kind}_s"] for r in rows),
            "tokens": None,
            "tokens_per_s": None,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
            "checkpoint_bytes": rows[-1][f"{kind}_bytes"],
            "checkpoint_save_s": statistics.median(r[f"{kind}_s"] for r in rows),
        }
        for kind in ("compact", "full")
    ]
    c, f = perf
    print("| checkpoint | bytes | save s (median) |\n|---|---|---|")
    print(f"| compact | {c['checkpoint_bytes']:,} | {c['seconds']:.2f} |")
    print(f"| full | {f['checkpoint_bytes']:,} | {f['seconds']:.2f} |")
    print(
        f"| full / compact | {f['checkpoint_bytes'] / c['checkpoint_bytes']:.1f}x | {f['seconds'] / c['seconds']:.1f}x |"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": " ".join(sys.argv),
                    "parameters": params,
                    "trainable": trainable,
                    "steps": rows,
                    "perf_stack": perf,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
