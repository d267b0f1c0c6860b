#!/usr/bin/env python
"""GPU update benchmark: one LoRA actor update step, plain peft against the efficient path.

    python scripts/bench_gpu_update.py --shape 8b --out $OUT/update_8b.json

The policy of training (atlas.model.policy.ActorCritic: a random-init Qwen3 of the shape in bf16,
vocab 151,936, actor and critic LoRA r64/a128 on all linear layers) with gradient checkpointing
on every decoder layer (non-reentrant), and per step one forward + backward over `--rows` rows of
`--row-tokens` synthetic tokens and one AdamW step of the actor. The variants are cumulative,
each adds one thing to the one above it:

    peft        the anchors' step: the [rows, T] batch through peft's forward (adapters in
                float32, peft's default), the model's own cross-entropy over full logits
    bf16        + adapters computed in bf16 (autocast; float32 master weights and AdamW states)
    packed      + padding removal (rows packed into one, varlen FlashAttention-2,
                atlas.rl.packing) and the chunked head (atlas.rl.fused_head): PPO's clipped loss
                over every token's log-prob under a grammar bitmask (synthetic masks), no full logits
    liger       + Liger kernels for RMSNorm, RoPE and SwiGLU (liger-kernel; not its loss)
    fused_lora  + the adapter product accumulated in the base GEMM (atlas.model.fused_lora)

FLOPs. "Model TFLOP/s" = 8 x P x tokens / seconds, with P the base model's parameters (embedding
and head included, tied weights once): the convention that reproduces the anchors' figures (8B:
8 x 8.19e9 x 8192 / 1.633 s = 329 TFLOP/s, 1.7B: 189). It counts forward (2PT), checkpoint
recompute (2PT) and a full fine-tuning backward (4PT); a LoRA step skips the base weights'
gradients, so the matmul work actually done is smaller; `executed_tflops` counts that (base and
head matmuls, adapter matmuls, causal attention) for each variant. MFU = model TFLOP/s / 792, the
bf16 8192^3 matmul rate measured on this H200 (../shared/research/gpu-anchors.md).

`--profile` adds one profiled step per variant: device time by kernel class, the busiest kernels.
Prints a table and writes JSON (perf_stack rows included) with the exact command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_rollout import SHAPES, VOCAB  # noqa: E402

from atlas.model.fused_lora import fused_lora  # noqa: E402
from atlas.rl.fused_head import output_weight, packed_token_logprobs  # noqa: E402
from atlas.rl.losses import policy_loss  # noqa: E402
from atlas.rl.packing import decoder, pack, packed_attention  # noqa: E402

PEAK_TFLOPS = 792.0  # bf16 8192^3 matmul, measured on this H200
VARIANTS = ("peft", "bf16", "packed", "liger", "fused_lora")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_policy(shape: str, lora: int, device: str, dtype):
    """ActorCritic on a random-init Qwen3 of `shape` (a peft model with actor and critic LoRA)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atlas.config import TrainingConfig
    from atlas.model.policy import ActorCritic

    config = Qwen3Config(
        vocab_size=VOCAB, head_dim=128, bos_token_id=None, eos_token_id=2, pad_token_id=0, **SHAPES[shape]
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        base = Qwen3ForCausalLM(config).to(dtype)
    training = TrainingConfig(
        responses_per_question=8, lora_rank=lora, lora_alpha=2 * lora, lora_targets="all-linear"
    )
    ac = ActorCritic(base, training, seed=0).to(device)
    ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ac.train()
    return ac, base


def apply_liger(base) -> None:
    """Liger's Triton RMSNorm, RoPE and SwiGLU in the Qwen3 base (the output head stays ours)."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3

    apply_liger_kernel_to_qwen3(
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
        model=base,
    )


def base_parameters(base) -> int:
    """The base model's parameters, without the LoRA tensors peft put inside its layers (tied
    weights are one tensor, counted once)."""
    return sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)


def executed_flops(config, rows: list[int], lora: int, head_recompute: bool) -> float:
    """Matmul FLOPs one LoRA step with full-layer checkpointing does: decoder linears forward,
    recompute and input-gradient (3 x 2PT); the head forward and input-gradient (+ recompute in
    the chunked head); adapters forward, recompute, input- and weight-gradient (4 x 2rT(in+out));
    causal attention forward, recompute and FlashAttention's backward (2.5x the forward)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]  # (in, out) per linear
    layer_params = sum(a * b for a, b in shapes)
    adapter_params = lora * sum(a + b for a, b in shapes)
    tokens = sum(rows)
    head = config.vocab_size * h
    total = 3 * 2 * layer_params * layers * tokens
    total += (3 if head_recompute else 2) * 2 * head * tokens
    total += 4 * 2 * adapter_params * layers * tokens
    attention_fwd = sum(4 * (n * (n + 1) / 2) * q for n in rows) * layers
    total += (1 + 1 + 2.5) * attention_fwd
    return total


def synthetic_masks(ids: torch.Tensor, seed: int):
    """Per row: every token after the first counts as generated, each under a bitmask that allows
    about 90% of the vocabulary (whole 32-token words dropped at random) and always its token."""
    from types import SimpleNamespace

    g = torch.Generator(device=ids.device).manual_seed(seed)
    words = -(-VOCAB // 32)
    out = []
    for row in ids:
        targets = row[1:]
        n = targets.numel()
        bitmask = torch.full((n, words), -1, dtype=torch.int32, device=ids.device)
        bitmask[torch.rand((n, words), generator=g, device=ids.device) < 0.1] = 0
        bitmask[torch.arange(n, device=ids.device), targets // 32] = -1
        out.append(SimpleNamespace(positions=torch.arange(1, n + 1), bitmask=bitmask))
    return out


class Steps:
    """The step functions of the variants on one policy and one batch."""

    def __init__(self, ac, ids: torch.Tensor, temperature: float, device: str):
        self.ac, self.ids, self.temperature, self.device = ac, ids, temperature, device
        self.opt = torch.optim.AdamW(list(ac.trainable("actor").values()), lr=1e-6)
        self.attn = torch.ones_like(ids)
        self.packed = pack(ids, self.attn)
        self.masks = synthetic_masks(ids, seed=1)
        self.sampled = torch.zeros(ids.shape, device=ids.device)
        self.sampled[:, 1:] = 1
        g = torch.Generator(device=ids.device).manual_seed(2)
        self.advantages = torch.randn(ids.shape, generator=g, device=ids.device) * self.sampled
        self.old_logprobs = None
        self.autocast = False

    def amp(self):
        return torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast)

    def hf_step(self) -> float:
        with self.ac.role("actor"):
            with self.amp():
                loss = self.ac.peft(input_ids=self.ids, labels=self.ids, use_cache=False).loss
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def packed_logprobs(self):
        hidden = decoder(self.ac.peft)(**self.packed.model_kwargs()).last_hidden_state
        lp, _ = packed_token_logprobs(
            hidden, output_weight(self.ac.peft), self.packed, self.masks, self.temperature
        )
        return lp

    def packed_step(self) -> float:
        with self.ac.role("actor"):
            with self.amp():
                lp = self.packed_logprobs()
                out = policy_loss(lp, self.old_logprobs, self.advantages, self.sampled, 0.2, 0.28, 3.0)
            out["actor/pg_loss"].backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return out["actor/pg_loss"].detach()


def timed(step, warmup: int, steps: int) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        step()
    sync()
    times, losses = [], []
    for _ in range(steps):
        t = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t)
        losses.append(float(loss))
    return times, losses


KERNEL_CLASSES = (  # device kernels by name, first match wins
    ("flash_attention", ("flash",)),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")),
    ("triton", ("triton",)),
)


def profile_step(step, path: Path | None, title: str) -> dict:
    """One profiled step: device time by kernel class (ms), and the top kernels appended to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - t
    classes: dict[str, float] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if not us or ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.key.lower()
        kind = next((k for k, keys in KERNEL_CLASSES if any(s in name for s in keys)), "other")
        classes[kind] = classes.get(kind, 0.0) + us / 1000
    if path is not None:
        events = prof.key_averages()
        with open(path, "a") as f:
            f.write(f"\n=== {title}: wall {1000 * wall:.1f} ms under the profiler ===\n")
            f.write(events.table(sort_by="self_device_time_total", row_limit=30) + "\n")
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=15) + "\n")
    out = {k: round(v, 2) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])}
    out["device_total"] = round(sum(classes.values()), 2)
    out["wall_under_profiler"] = round(1000 * wall, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--row-tokens", type=int, default=2048)
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", type=Path, help="folder for the profiled steps' kernel tables")
    p.add_argument("--device", default="cuda", help="cpu only to try the script out")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or variants != [v for v in VARIANTS if v in variants]:
        raise SystemExit(f"--variants: {unknown or variants}; expected a subsequence of {VARIANTS}")
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32

    ac, base = build_policy(args.shape, args.lora, args.device, dtype)
    params = base_parameters(base)
    g = torch.Generator(device=args.device).manual_seed(0)
    ids = torch.randint(3, VOCAB, (args.rows, args.row_tokens), generator=g, device=args.device)
    tokens = ids.numel()
    rows = [args.row_tokens] * args.rows
    steps = Steps(ac, ids, args.temperature, args.device)
    versions = {"torch": torch.__version__}
    for mod in ("transformers", "peft", "liger_kernel"):
        with contextlib.suppress(Exception):
            versions[mod] = __import__(mod).__version__ if mod != "liger_kernel" else _liger_version()
    results = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "python": platform.python_version(),
        **versions,
        "shape": args.shape,
        "vocab": VOCAB,
        "lora_rank": args.lora,
        "lora_alpha": 2 * args.lora,
        "base_parameters": params,
        "trainable_actor": sum(p.numel() for p in ac.trainable("actor").values()),
        "rows": args.rows,
        "row_tokens": args.row_tokens,
        "tokens": tokens,
        "gradient_checkpointing": "every decoder layer, non-reentrant",
        "flops_convention": "model TFLOP/s = 8 x base_parameters x tokens / s (the anchors'); "
        "MFU = model TFLOP/s / 792; executed_tflops: matmul FLOPs this LoRA step does / s",
        "synthetic": "random-init weights, random token ids, random advantages; every token after "
        "a row's first is scored under a random bitmask allowing ~90% of the vocabulary",
        "variants": [],
    }
    profiles = {}
    with contextlib.ExitStack() as stack:
        for name in variants:
            if name == "bf16":
                steps.autocast = cuda
                for m in ac.modules():  # keep activations bf16: autocast runs the adapters in bf16
                    if hasattr(m, "cast_input_dtype_enabled"):
                        m.cast_input_dtype_enabled = False
            if name == "packed":
                stack.enter_context(packed_attention(ac.peft))
                with torch.no_grad(), ac.role("actor"), steps.amp():
                    steps.old_logprobs = steps.packed_logprobs().detach()
                    results["packed_vs_padded"] = packed_vs_padded(steps)
                print("packed vs padded log-probs:", json.dumps(results["packed_vs_padded"]), flush=True)
            if name == "liger":
                apply_liger(base)
            if name == "fused_lora":
                stack.enter_context(fused_lora(ac.peft))
            step = steps.hf_step if name in ("peft", "bf16") else steps.packed_step
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            times, losses = timed(step, args.warmup, args.steps)
            seconds = statistics.median(times)
            model_tflops = 8 * params * tokens / seconds / 1e12
            executed = executed_flops(
                base.config, rows, args.lora, head_recompute=name != "peft" and name != "bf16"
            )
            row = {
                "variant": name,
                "seconds": seconds,
                "all_seconds": times,
                "losses": losses,
                "tokens_per_s": tokens / seconds,
                "model_tflops": model_tflops,
                "mfu": model_tflops / PEAK_TFLOPS,
                "executed_tflops": executed / seconds / 1e12,
                "executed_share_of_peak": executed / seconds / 1e12 / PEAK_TFLOPS,
                "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            }
            results["variants"].append(row)
            print(
                f"{name:11s} {seconds:7.3f} s  {row['tokens_per_s']:8.0f} tok/s  "
                f"{model_tflops:6.1f} model TFLOP/s  MFU {100 * row['mfu']:5.1f}%  "
                f"executed {row['executed_tflops']:6.1f} TFLOP/s  "
                f"peak {row['peak_memory_gb'] or 0:6.1f} GiB  loss {losses[-1]:.4f}",
                flush=True,
            )
            if args.profile and cuda:
                args.profile.mkdir(parents=True, exist_ok=True)
                profiles[name] = profile_step(step, args.profile / f"kernels_{args.shape}.txt", name)
                print(f"profile {name} (device ms by kernel class): {profiles[name]}", flush=True)
    results["profile_ms_by_kernel_class"] = profiles

    device = results["device"]
    shape = f"qwen3 {args.shape} v{VOCAB} lora r{args.lora}"
    results["perf_stack"] = [
        {
            "source": "committed",
            "test": "update",
            "run": "bench",
            "device": device,
            "model_shape": shape,
            "phase": f"update_actor_{r['variant']}",
            "steps": args.steps,
            "seconds": r["seconds"],
            "tokens": tokens,
            "tokens_per_s": r["tokens_per_s"],
            "peak_memory_gb": r["peak_memory_gb"],
            "checkpoint_bytes": None,
            "checkpoint_save_s": None,
        }
        for r in results["variants"]
    ]
    print(
        f"\n| variant ({args.shape}, {args.rows} x {args.row_tokens} tokens) | s/step | tok/s | "
        "model TFLOP/s | MFU | executed TFLOP/s | peak GiB |\n|---|---|---|---|---|---|---|"
    )
    for r in results["variants"]:
        print(
            f"| {r['variant']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} | {r['model_tflops']:.0f} | "
            f"{100 * r['mfu']:.1f}% | {r['executed_tflops']:.0f} | {r['peak_memory_gb'] or 0:.1f} |"
        )
    if args.out:
        from atlas.hashing import atomic_write_json

        atomic_write_json(args.out, results)


def packed_vs_padded(steps: Steps) -> dict:
    """The same rows' log-probs through the padded model (full logits, replay's masked
    log-softmax) and the packed path that is timed: the largest gap, in the run's precision."""
    from atlas.rl.replay import masked_logprobs

    ac, n = steps.ac, min(2, steps.ids.shape[0])
    gaps, floor = [], []
    with packed_attention_off(ac.peft):
        pair = ac.actor_logits(steps.ids[:n], steps.attn[:n])  # the same rows, two at a time
        for r in range(n):
            m = steps.masks[r]
            logits = ac.actor_logits(steps.ids[r : r + 1], steps.attn[r : r + 1])[0]
            pos = m.positions.to(logits.device)
            ref = masked_logprobs(logits[pos - 1], steps.ids[r, pos], m.bitmask, steps.temperature)
            two = masked_logprobs(pair[r, pos - 1], steps.ids[r, pos], m.bitmask, steps.temperature)
            gaps.append((ref - steps.old_logprobs[r, pos]).abs().max().item())
            floor.append((ref - two).abs().max().item())
    return {
        "rows": n,
        "max_abs_logprob_diff": max(gaps),
        # the padded path against itself, one row vs two rows a forward: the precision's noise floor
        "padded_single_vs_pair_max_abs_diff": max(floor),
        "dtype": str(next(ac.parameters()).dtype),
    }


@contextlib.contextmanager
def packed_attention_off(model):
    """The model's attention as it was before packing (the padded forward needs its mask)."""
    inner = model.get_base_model()
    before = inner.config._attn_implementation
    inner.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        inner.set_attn_implementation(before)


def _liger_version() -> str:
    from importlib.metadata import version

    return version("liger-kernel")


if __name__ == "__main__":
    main()
