#!/usr/bin/env python
"""GPU rollout benchmark: StaticEngine against plain transformers generate, grammar on and off.

    python scripts/bench_gpu_rollout.py --tokenizer .gpu/tokenizer --shape 1.7b --batch 256 \
        --new 128 --out $OUT/rollout.json

On one CUDA device, a random-init Qwen3 of a real shape (bf16) with an actor LoRA (r64/a128,
all linear layers, as training has it), and a synthetic byte-level BPE tokenizer of 151,936
tokens (`--tokenizer`: a folder from `--build-tokenizer`, which takes about a minute on CPU).
Every variant decodes the same chat prompts (the tools listed in the system turn; `--samples`
responses per question, 8 as in the report's 32 x 8 batch) for `--new` steps at one batch, and
reports ms per decode step and generated tokens/s (prompt included: the time of the whole call):

    hf_generate            plain `model.generate`, dynamic cache, no grammar (the research anchor)
    hf_generate_static     the same with cache_implementation="static" (transformers compiles it)
    static_free            StaticEngine, no grammar
    static_grammar         StaticEngine with the call grammar (masks batched, overlapped)
    static_grammar_full    the same with finished rows kept in the batch (no shrinking), so its
                           steps have static_free's shapes: `grammar_overhead_per_step` compares
                           these two

and `agreement`: StaticEngine against HFEngine on the same seeds in float32 (small batch), rows
whose tokens, sampled/forced flags and finish reason are identical, and the largest log-prob gap.
With `--profile DIR`, one more grammar run under torch.profiler: the CUDA kernels by total time go
to DIR/rollout_kernels_<shape>.txt and the top ones into the JSON. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

SHAPES = {  # Qwen3 shapes (hidden, MLP, layers, heads, kv heads, tied embeddings)
    "1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "2layer": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    ),
}
VOCAB = 151_936


def build_tokenizer(out: Path) -> None:
    from atlas.model.tiny import synthetic_lines, train_tokenizer

    t = time.perf_counter()
    tok = train_tokenizer(synthetic_lines(40_000), VOCAB, 40_960)
    tok.save_pretrained(out)
    print(f"tokenizer: {len(tok)} tokens in {time.perf_counter() - t:.0f} s -> {out}")


def build_model(tokenizer, shape: str, dtype, lora: int, device: str = "cuda"):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atlas.chat import IM_END, PAD

    config = Qwen3Config(
        vocab_size=VOCAB,
        head_dim=128,
        max_position_embeddings=40_960,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        bos_token_id=None,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=lora, lora_alpha=2 * lora, target_modules="all-linear"), adapter_name="actor"
        ).eval()
    return model


def chat_requests(rt, batch: int, new: int, seed: int = 0, samples: int = 1):
    """`batch` requests: batch / samples questions, each asked `samples` times with its own seed
    (the report's rollout batch is 32 questions x 8 responses)."""
    from atlas.runtime.engine import GenerationRequest
    from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools

    code = CodeBounds.of(rt_cfg())
    out = []
    for i in range(batch):
        q = i // samples
        tools = gpqa_tools(code) if q % 2 == 0 else lcb_tools(code)
        prompt = rt.chat_ids(
            [{"role": "user", "content": f"Question {q}: which option holds? Think, then call a tool."}],
            [t.spec() for t in tools.values()],
        )
        out.append(GenerationRequest(prompt, rt.grammars.get(tools), new, seed=seed + i))
    return out


def rt_cfg():
    from atlas.config import RuntimeConfig

    return RuntimeConfig(max_text_tokens=48, max_code_run=64, max_code_escapes=8, max_generation_tokens=1024)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int):
    fn()  # warm-up: compilation and graph capture happen here
    sync()
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2], result


def hf_generate(model, tokenizer, requests, new: int, static: bool):
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        attn[i, width - len(r.prompt_ids) :] = 1
    ids, attn = ids.to(model.device), attn.to(model.device)
    kwargs = {"cache_implementation": "static"} if static else {}

    def run():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=True,
            pad_token_id=tokenizer.pad_token_id,
            **kwargs,
        )
        return (out.shape[1] - width) * len(requests)

    return run


def engine_run(engine, requests):
    def run():
        gens = engine.generate(requests)
        return sum(len(g.token_ids) for g in gens), gens

    return run


def agreement(tokenizer, shape: str, batch: int, device: str) -> dict:
    """StaticEngine (compiled) against HFEngine on the same seeds, float32, the same model: 4
    samples a question, so the shared prompts and the shrinking batch are part of it."""
    from atlas.runtime.fast_engine import StaticEngine
    from atlas.runtime.session import make_runtime

    model = build_model(tokenizer, shape, torch.float32, lora=0, device=device)
    rt = make_runtime(model, tokenizer, rt_cfg())
    hf = rt.engine
    fast = StaticEngine(
        model,
        hf.vocab_size,
        hf.stop_token_ids,
        hf.pad_token_id,
        banned_token_ids=rt.grammars.banned_token_ids,
    )
    requests = chat_requests(rt, batch, 256, seed=500, samples=4)  # prompts shared, rows finishing
    a, b = hf.generate(requests), fast.generate(requests)
    same = sum(
        x.token_ids == y.token_ids and x.sampled == y.sampled and x.finish_reason == y.finish_reason
        for x, y in zip(a, b, strict=True)
    )
    gap = max(
        abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x.logprobs, y.logprobs, strict=False)
    )
    first = [
        next((k for k, (p, q) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if p != q), None)
        for x, y in zip(a, b, strict=False)
    ]
    return {
        "shape": shape,
        "dtype": "float32",
        "rows": batch,
        "identical_rows": same,
        "max_logprob_gap_on_common_prefix": gap,
        "first_divergence": first,
        "tokens": sum(len(x.token_ids) for x in a),
        "forced": sum(x.sampled.count(0) for x in a),
    }


def profile_run(engine, requests, table: Path, top: int = 12) -> dict:
    """One (warm) generate call under torch.profiler: kernels by total CUDA time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        gens = engine.generate(requests)
        sync()
    wall = time.perf_counter() - t
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    events.sort(key=lambda e: -e.device_time_total)
    device_total = sum(e.device_time_total for e in events if e.device_type.name == "CUDA")
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(prof.key_averages().table(sort_by="device_time_total", row_limit=40) + "\n")
    kernels = [e for e in events if e.device_type.name == "CUDA"][:top]
    print(f"profile: {wall:.2f} s wall, {device_total / 1e6:.2f} s of kernels -> {table}")
    for e in kernels:
        print(f"  {e.device_time_total / 1e3:9.1f} ms {e.count:7d}x  {e.key[:90]}")
    return {
        "wall_s": wall,
        "kernel_s": device_total / 1e6,
        "tokens": sum(len(g.token_ids) for g in gens),
        "steps": max(len(g.token_ids) for g in gens),
        "top_kernels": [
            {"kernel": e.key, "ms": e.device_time_total / 1e3, "calls": e.count} for e in kernels
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", type=Path, default=Path(".gpu/tokenizer"))
    p.add_argument("--build-tokenizer", action="store_true", help="build the tokenizer folder and exit")
    p.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument(
        "--samples", type=int, default=8, help="responses per question (1: every prompt different)"
    )
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--lora", type=int, default=64, help="actor LoRA rank (0: none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--variants",
        default="hf_generate,hf_generate_static,static_free,static_grammar,static_grammar_full,agreement",
    )
    p.add_argument("--device", default="cuda", help="cpu only to try the script out")
    p.add_argument("--profile", type=Path, help="folder for the kernel table of one grammar run")
    p.add_argument("--out", type=Path, required=False)
    args = p.parse_args()
    if args.build_tokenizer:
        build_tokenizer(args.tokenizer)
        return
    from transformers import AutoTokenizer

    from atlas.runtime.fast_engine import StaticEngine
    from atlas.runtime.session import make_runtime

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    variants = args.variants.split(",")
    results = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "shape": args.shape,
        "vocab": VOCAB,
        "batch": args.batch,
        "samples_per_question": args.samples,
        "new_tokens": args.new,
        "lora_rank": args.lora,
        "command": " ".join(sys.argv),
        "rows": [],
    }
    model = build_model(tokenizer, args.shape, torch.bfloat16, args.lora, args.device)
    rt = make_runtime(model, tokenizer, rt_cfg())
    requests = chat_requests(rt, args.batch, args.new, samples=args.samples)
    results["prompt_tokens"] = [
        min(len(r.prompt_ids) for r in requests),
        max(len(r.prompt_ids) for r in requests),
    ]
    engine = StaticEngine(
        model,
        rt.engine.vocab_size,
        rt.engine.stop_token_ids,
        rt.engine.pad_token_id,
        banned_token_ids=rt.grammars.banned_token_ids,
    )

    def row(name: str, seconds: float, tokens: int, steps: int, **extra):
        r = {
            "variant": name,
            "seconds": seconds,
            "tokens": tokens,
            "steps": steps,
            "ms_per_step": 1000 * seconds / steps,
            "tokens_per_s": tokens / seconds,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
            **extra,
        }
        results["rows"].append(r)
        print(
            f"{name:22s} {r['ms_per_step']:8.2f} ms/step {r['tokens_per_s']:10.0f} tok/s  {tokens} tokens",
            flush=True,
        )

    for name in variants:
        if name in ("hf_generate", "hf_generate_static"):
            s, tokens = timed(
                hf_generate(model, tokenizer, requests, args.new, name.endswith("static")), args.repeats
            )
            row(name, s, tokens, args.new)
        elif name in ("static_free", "static_grammar", "static_grammar_full", "static_grammar_peft"):
            engine.constrained = name != "static_free"
            engine.shrink = name != "static_grammar_full"
            fused = engine.fuse_lora
            engine.fuse_lora = fused and name != "static_grammar_peft"  # peft's own LoRA forward
            s, (tokens, gens) = timed(engine_run(engine, requests), args.repeats)
            steps = max(len(g.token_ids) for g in gens)
            mask = sum(g.mask_s for g in gens) / max(tokens, 1)
            row(
                name,
                s,
                tokens,
                steps,
                live_row_fraction=tokens / (steps * len(gens)),
                mask_fill_us_per_token=1e6 * mask,
                forced=sum(g.sampled.count(0) for g in gens),
                fused_lora=engine.fuse_lora,
                cpu_seconds=dict(engine.last_timing),  # of the last timed call
            )
            print("  cpu seconds:", {k: round(v, 3) for k, v in engine.last_timing.items()}, flush=True)
            engine.fuse_lora = fused
        elif name == "agreement":
            results["agreement"] = agreement(tokenizer, "2layer", 32, args.device)
            print("agreement:", json.dumps(results["agreement"]), flush=True)
    if args.profile:
        engine.constrained, engine.shrink = True, True
        results["profile"] = profile_run(engine, requests, args.profile / f"rollout_kernels_{args.shape}.txt")
    by = {r["variant"]: r for r in results["rows"]}
    if "static_free" in by and "static_grammar_full" in by:
        results["grammar_overhead_per_step"] = (
            by["static_grammar_full"]["ms_per_step"] / by["static_free"]["ms_per_step"] - 1
        )
        print(f"grammar overhead per step: {100 * results['grammar_overhead_per_step']:.1f}%")
    if "hf_generate" in by and "static_grammar" in by:
        results["speedup_vs_hf_generate"] = (
            by["static_grammar"]["tokens_per_s"] / by["hf_generate"]["tokens_per_s"]
        )
        print(
            f"StaticEngine with grammar vs plain generate: {results['speedup_vs_hf_generate']:.2f}x tokens/s"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
