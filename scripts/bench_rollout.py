#!/usr/bin/env python
"""Rollout benchmark: the trainer's rollout engine on the report's batch, in two modes.

    python scripts/bench_rollout.py --config config/h200.yaml --data results/data \
        [--modes generation,episode] [--out rollout.json]

With ATLAS_GPU_MEM_GB set, the process holds to that much GPU memory as a pipeline job does
(resources.gpu_memory_gb; the rollout pool takes half of it). The model is `--model DIR`; by default the base the pipeline built for the config
(results/models/<model.name>) or, before the pipeline has run, the config's `model.shape` built
here (atlas.model.shapes: random-init Qwen3 dimensions over the synthetic 151,936-token
tokenizer; `--tokenizer DIR` keeps that tokenizer for the next call); on the GPU in bf16, on the
CPU in float32. The runtime is the config's (`--config` merged over config/config.yaml, as Snakemake
merges it), made by the trainer's own functions.

generation   one grammar-constrained generation per request: atlas.runtime.synthetic's 32
             questions x 8 samples of first turns, `--new` tokens each, timed after a warm-up
             call. Arms: `base` (no LoRA), `adapters` (the actor LoRA through peft's layers),
             `merged` (the same actor folded into a copy, as training serves it); the merged
             model's log-probs are compared with the adapters' on the generated rows. `--profile
             FILE` runs the last arm's last call under torch.profiler and writes the kernels' device
             time by kind (decode attention, the pick, matrix products, ...), then the operators
             and kernels by device time, to FILE.
episode      the trainer's episode loop (atlas.runtime.rollouts.rollout): the schedule's step-0
             questions (`--data`, results/data of the same config) x training.responses_per_question,
             multi-turn, every call run and graded in the sandbox, sampled through the merged
             actor (atlas.rl.serving.rollout_runtime; `--episode-model base` samples the base)
             as the train stage's first step samples it: the actor's LoRA B at zero, as peft
             initialises it (the generation mode's arms set it off zero; the episode mode puts
             it back), and the seeds of the config's first run. First a warm-up as the training
             stage runs one: validation on training.validation_questions x validation_samples.
             Then `--repeats` rollouts of the step (the first with that step's seeds, the next
             ones with the next steps') per `--schedules`: `continuous` (the trainer's: a turn joins the
             engine's running rows when its tool returns) and `rounds` (every ready turn in one
             batch that runs to its last row; the next once every tool is back). Tokens/s is
             generated tokens over the rollout's wall seconds: what a training step reports as
             perf/rollout_tokens_per_s. Each rollout is broken down by the engine's clock: prefill
             (with the admissions of arrivals), graph capture, grammar masks, launches, waits for
             the GPU, host bookkeeping, and `idle_s` (no row to generate: every live episode's
             tool running); with steps, rows per step and admissions.

`--decode-attention flash` runs the engines' decode steps through FlashAttention-2 instead of
the split kernel (atlas.runtime.decode_attention; scripts/bench_attention.py times the two alone).
`--no-shared-prefixes` has every row read its own copy of its prompt's keys instead of its prefix
group's once (the split kernel's shared prefixes). `--no-fused` runs transformers' Qwen3 forward
instead of atlas.runtime.fused_qwen3's. `--split-pick` picks each step's tokens through
atlas.runtime.split_pick's kernels instead of the compiled torch spelling.

Prints one table per mode and writes everything as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoTokenizer

from atlas.config.study import merged, parse_config, read_yaml
from atlas.runtime.engine import serve_in_rounds
from atlas.runtime.fast_engine import CLOCK_COUNTS, CLOCK_SECONDS
from atlas.runtime.inputs import read_questions, read_tests, smoke_slice
from atlas.runtime.rollouts import episode_specs, rollout
from atlas.runtime.session import load_model, make_runtime
from atlas.runtime.synthetic import tool_requests
from atlas.runtime.tools import CodeBounds
from atlas.stage import hold_gpu_memory

REPO = Path(__file__).resolve().parent.parent


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_generate(rt, reqs, repeats: int, device, profile: Path | None = None) -> tuple[dict, list]:
    rt.engine.generate(reqs)  # the first call: graphs captured, the sampler compiled
    times = []
    for k in range(repeats):
        sync(device)
        t = time.perf_counter()
        if profile is not None and k == repeats - 1:
            gens = profiled(lambda: rt.engine.generate(reqs), profile, device)
        else:
            gens = rt.engine.generate(reqs)
        sync(device)
        times.append(time.perf_counter() - t)
    seconds, tokens = statistics.median(times), sum(len(g.token_ids) for g in gens)
    row = dict(
        seconds=seconds,
        tokens=tokens,
        tokens_per_s=tokens / seconds,
        timing=getattr(rt.engine, "last_timing", {}),
    )
    return row, gens


# A kernel's kind by its name (its demangled name before any template or argument list): the
# engine's own Triton kernels, Inductor's (the compiled pick), FlashAttention's (before cuBLAS's,
# whose names its template arguments repeat), cuBLAS's; everything else (copies, elementwise) last.
KINDS = (
    ("decode attention", ("_split_kernel", "_combine_kernel", "_shared_kernel", "_shared_combine_kernel")),
    ("the pick", ("_stats_kernel", "_draw_kernel", "_finish_kernel", "triton_")),
    (
        "RMSNorm, RoPE, SwiGLU",
        (
            "_add_rms_norm_kernel",
            "_qk_rope_store_kernel",
            "_silu_mul_kernel",
            "_rms_norm",
            "_block_rms_norm",
            "_triton_rope",
            "_swiglu",
        ),
    ),
    ("prefill attention", ("flash",)),
    ("matrix products", ("nvjet", "gemm", "cutlass", "xmma", "sm90_", "sm80_")),
)


def kernel_kind(name: str) -> str:
    base = re.split(r"[<(]", name, maxsplit=1)[0]
    for kind, marks in KINDS:
        if any(base.startswith(m) if m.startswith("_") or m == "triton_" else m in base for m in marks):
            return kind
    return "copies, elementwise, other"


def device_kernels(events) -> list[tuple[str, float, int]]:
    """(name, device microseconds, launches) of every kernel and copy the device ran, from the
    profiler's events (the device's own: an operator or a launch wrapper that shares a kernel's
    name is a host event and counts nothing here)."""
    from torch.autograd import DeviceType

    time_of: dict[str, float] = {}
    count_of: dict[str, int] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA:
            time_of[e.name] = time_of.get(e.name, 0.0) + e.time_range.elapsed_us()
            count_of[e.name] = count_of.get(e.name, 0) + 1
    return [(name, us, count_of[name]) for name, us in time_of.items()]


def kinds_table(kernels) -> str:
    """(name, device microseconds, count) of every kernel, summed by kernel_kind."""
    time_of, count_of = {}, {}
    for name, us, count in kernels:
        kind = kernel_kind(name)
        time_of[kind] = time_of.get(kind, 0.0) + us
        count_of[kind] = count_of.get(kind, 0) + count
    total = sum(time_of.values()) or 1.0
    lines = ["| kernels | device ms | share | launches |", "|---|---:|---:|---:|"]
    for kind in sorted(time_of, key=time_of.get, reverse=True):
        lines.append(
            f"| {kind} | {time_of[kind] / 1e3:.1f} | {time_of[kind] / total:.1%} | {count_of[kind]} |"
        )
    lines.append(f"| all | {total / 1e3:.1f} | | {sum(count_of.values())} |")
    return "\n".join(lines) + "\n"


def profiled(fn, path: Path, device):
    """fn() under torch.profiler; the operators and kernels by device time, as a table in `path`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        out = fn()
        sync(device)
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30)
    if device == "cuda":  # every kernel by its own time, and the kernels by kind first
        table += "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=-1)
        table = kinds_table(device_kernels(prof.events())) + "\n" + table
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table)
    print(table)
    return out


def logprob_gap(ac, serving, reqs, gens, device, rows: int = 8) -> float:
    """Max |log p_merged - log p_adapters| of the generated tokens (raw distribution)."""
    gap = 0.0
    with torch.no_grad():
        for r, g in list(zip(reqs, gens, strict=True))[:rows]:
            ids = torch.tensor([list(r.prompt_ids) + g.token_ids], device=device)
            n = len(g.token_ids)
            tgt = ids[0, -n:]
            a, b = ac.actor_logits(ids), serving.model(input_ids=ids).logits
            a, b = (x[0, -n - 1 : -1].float().log_softmax(-1).gather(-1, tgt[:, None]) for x in (a, b))
            gap = max(gap, (a - b).abs().max().item())
    return gap


def actor_lora_b(ac) -> list[torch.Tensor]:
    return [t for name, t in ac.trainable("actor").items() if "lora_B" in name]


def trained_looking(ac) -> None:
    """The actor's LoRA B off zero, so serving it merged or through adapters makes a difference."""
    with torch.no_grad():
        for t in actor_lora_b(ac):
            t.normal_(0, 1e-3)


class Policy:
    """The trainer's policy on the base (atlas.rl.serving: LoRA actor and critic, what `auto`
    turns on) and the merged serving copy the trainer samples from, built once for both modes."""

    def __init__(self, base, tokenizer, cfg, device):
        from atlas.rl.serving import policy_on, rollout_runtime

        self.ac = policy_on(base, cfg.training, seed=cfg.seed, device=device)
        trained_looking(self.ac)
        self.rt, self.serving = rollout_runtime(self.ac, tokenizer, cfg.training, cfg.runtime, device)

    def as_at_the_first_step(self) -> None:
        """The actor's LoRA B back at zero, as the train stage's first step samples it (and the
        merged copy refreshed in place, as the trainer refreshes it)."""
        with torch.no_grad():
            for t in actor_lora_b(self.ac):
                t.zero_()
        if self.serving is not None:
            self.serving.refresh()


def with_attention(rt, args):
    """The runtime with its engine's decode attention set by --decode-attention and
    --no-shared-prefixes, its forward by --no-fused and its pick by --split-pick (before any call: a
    captured step bakes in its kernels)."""
    if args.decode_attention is not None or args.no_shared_prefixes or args.no_fused or args.split_pick:
        if getattr(rt.engine, "captures", 0):
            raise RuntimeError(
                "--decode-attention, --no-shared-prefixes, --no-fused, --split-pick: "
                "the engine has captured steps already"
            )
        if args.no_fused:
            rt.engine.fused = None
        if args.split_pick:  # the engine refuses a top_p under 1, and a device without Triton
            rt.engine.split_pick = True
        if args.decode_attention is not None:
            rt.engine.decode_attention = args.decode_attention
        if args.no_shared_prefixes:
            rt.engine.share_prefixes = False
    return rt


def generation_mode(args, base, tokenizer, cfg, device, policy) -> dict:
    runtime = cfg.runtime
    arms = {}
    for arm in args.arms.split(","):
        pol = policy() if arm != "base" else None
        if arm == "merged" and pol.serving is None:
            raise SystemExit("--arms merged: the config serves no merged copy (training.merged_rollouts)")
        model = {
            "base": base,
            "adapters": pol and pol.ac.peft,
            "merged": pol and pol.serving and pol.serving.model,
        }[arm]
        rt = with_attention(make_runtime(model, tokenizer, runtime), args)
        reqs = tool_requests(
            rt,
            questions=args.questions,
            samples=args.samples,
            max_new=args.new,
            bounds=CodeBounds.of(runtime),
        )
        profile = args.profile if arm == args.arms.split(",")[-1] else None
        row, gens = timed_generate(rt, reqs, args.repeats, device, profile)
        if device == "cuda":
            row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        if arm == "merged":
            t = time.perf_counter()
            pol.serving.refresh()
            sync(device)
            row["refresh_s"] = time.perf_counter() - t
            row["logprob_gap_vs_adapters"] = logprob_gap(pol.ac, pol.serving, reqs, gens, device)
        arms[arm] = row
        del rt
    for row in arms.values():
        if "base" in arms:
            row["vs_base"] = row["tokens_per_s"] / arms["base"]["tokens_per_s"]
    return dict(new_tokens=args.new, batch=args.questions * args.samples, arms=arms)


TIMING, COUNTS = CLOCK_SECONDS, CLOCK_COUNTS  # the engine clock's own keys


def first_run(cfg) -> str:
    """The config's first run: the train stage's episode seeds are the run's (episode_seed)."""
    return next(iter(cfg.runs), "bench")


def timed_rollout(
    rt, specs, cfg, *, step: int, phase: str, device, schedule: str, profile: Path | None = None
) -> dict:
    """One rollout of `specs` through the trainer's episode loop, with the engine's clock.
    schedule `continuous`: the engine's own serve (a turn joins the running rows when its tool
    returns: what the trainer runs); `rounds`: every ready turn in one batch that runs to its
    last row, the next once all tools are back (atlas.runtime.engine.serve_in_rounds)."""
    calls = []
    engine = rt.engine

    def clocked(requests, on_finish=None):  # a round's engine call
        sync(device)
        t = time.perf_counter()
        gens = engine.generate(requests, on_finish=on_finish)
        sync(device)
        calls.append({"rows_asked": len(requests), "seconds": time.perf_counter() - t})
        calls[-1].update(getattr(engine, "last_timing", {}))
        return gens

    def serve(feed):
        if schedule == "rounds":
            return serve_in_rounds(clocked, feed, forget=getattr(engine, "forget", None))
        sync(device)
        t = time.perf_counter()
        engine.serve(feed)
        sync(device)
        calls.append({"seconds": time.perf_counter() - t} | getattr(engine, "last_timing", {}))

    # the loop is handed the engine behind a clock (the engine itself is left as it is)
    clocked_rt = dataclasses.replace(rt, engine=SimpleNamespace(serve=serve, vocab_size=engine.vocab_size))

    def go():
        return rollout(
            clocked_rt,
            specs,
            cfg.runtime,
            cfg.graders,
            run=first_run(cfg),
            step=step,
            phase=phase,
            seed=cfg.seed,
        )

    t = time.perf_counter()
    episodes = go() if profile is None else profiled(go, profile, device)
    seconds = time.perf_counter() - t
    tokens = sum(r.generated_tokens for ep in episodes for r in ep.records)
    engine_clock = {k: sum(c.get(k, 0) for c in calls) for k in ("seconds", *TIMING, *COUNTS)}
    by_bucket = {}  # rows of a bucket -> [steps, seconds, GPU seconds], over the rollout's engine calls
    for c in calls:
        for rows, figures in c.get("by_bucket", {}).items():
            total = by_bucket.setdefault(rows, [0, 0.0, 0.0])
            for k, v in enumerate(figures):
                total[k] += v
    engine_clock["by_bucket"] = dict(sorted(by_bucket.items()))
    engine_clock["rows_per_step"] = engine_clock["rows"] / max(1, engine_clock["steps"])
    run = dict(
        schedule=schedule,
        episodes=len(episodes),
        generations=sum(len(ep.records) for ep in episodes),
        seconds=seconds,
        tokens=tokens,
        tokens_per_s=tokens / seconds,
        engine=engine_clock,
        calls=calls,
    )
    clock = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in engine_clock.items())
    print(f"  {phase} step {step} {schedule}: {tokens} tokens in {seconds:.2f} s; {clock}", file=sys.stderr)
    return run


def episode_mode(args, base, tokenizer, cfg, device, policy) -> dict:
    training = cfg.training
    # the trainer's rollout runtime (its own engine, over the merged copy on a GPU), or the base's
    if args.episode_model == "merged":
        policy().as_at_the_first_step()
        rt = policy().rt
    else:
        rt = make_runtime(base, tokenizer, cfg.runtime)
    rt = with_attention(rt, args)
    data = args.data
    train_rows = read_questions(data / "train.parquet")
    tests = read_tests(data / "tests.parquet")
    val = read_questions(data / "val.parquet")
    val = smoke_slice(val, training.validation_questions or len(val))
    questions = sorted((r for r in train_rows if r["step"] == 0), key=lambda r: r["position"])
    out = dict(
        model=args.episode_model,
        seeds_of=first_run(cfg),
        questions=len(questions),
        responses=training.responses_per_question,
        max_turns=cfg.runtime.max_turns,
        max_generation_tokens=cfg.runtime.max_generation_tokens,
    )
    # as the train stage does before its first rollout (rl.step.Session.prepare_rollouts)
    t = time.perf_counter()
    rt.engine.prepare(len(questions) * training.responses_per_question)
    out["prepare_s"] = time.perf_counter() - t
    print(
        f"  engine prepared for {len(questions) * training.responses_per_question} rows in {out['prepare_s']:.2f} s",
        file=sys.stderr,
    )
    specs = episode_specs(val, tests, training.validation_samples)
    out["warmup"] = timed_rollout(rt, specs, cfg, step=0, phase="val", device=device, schedule="continuous")
    specs = episode_specs(questions, tests, training.responses_per_question)
    out["schedules"] = {}
    engine = rt.engine
    default = (getattr(engine, "admit_share", None), getattr(engine, "admit_wait", None))
    for schedule in args.schedules.split(","):
        admits = [default]
        if schedule == "continuous" and args.admit and default[0] is not None:
            admits = [(float(a), int(b)) for a, b in (x.split(":") for x in args.admit.split(","))]
        for share, wait in admits:
            name = schedule if (share, wait) == default else f"{schedule} admit {share}:{wait}"
            if share is not None:
                engine.admit_share, engine.admit_wait = share, wait
            runs = [
                timed_rollout(rt, specs, cfg, step=k, phase="train", device=device, schedule=schedule)
                for k in range(args.repeats)
            ]
            out["schedules"][name] = dict(
                runs=runs, tokens_per_s=statistics.median(r["tokens_per_s"] for r in runs)
            )
    if default[0] is not None:
        engine.admit_share, engine.admit_wait = default
    if args.profile_episode:  # one more rollout of the first schedule, under the profiler (not timed)
        first = args.schedules.split(",")[0]
        out["profiled"] = timed_rollout(
            rt, specs, cfg, step=0, phase="train", device=device, schedule=first, profile=args.profile_episode
        )
    out["tokens_per_s"] = next(iter(out["schedules"].values()))["tokens_per_s"]
    return out


def print_generation(res: dict) -> None:
    print(f"generation: {res['batch']} rows x {res['new_tokens']} new tokens")
    for arm, row in res["arms"].items():
        extra = " ".join(
            f"{k}={row[k]:.4g}" for k in ("vs_base", "refresh_s", "logprob_gap_vs_adapters") if k in row
        )
        print(
            f"  {arm:10s} {row['tokens_per_s']:10.0f} tok/s  {row['seconds']:.2f} s  {row['tokens']} tokens {extra}"
        )


def print_episode(res: dict) -> None:
    print(f"episode: {res['questions']} questions x {res['responses']} responses, {res['model']} model")
    print(
        f"  {'schedule':24s} {'run':>3s} {'tokens':>7s} {'seconds':>7s} {'tok/s':>7s} {'engine':>7s} "
        + " ".join(f"{k:>9s}" for k in TIMING)
        + f" {'steps':>5s} {'rows/step':>9s} {'admits':>6s}"
    )
    runs = [("warmup", 0, res["warmup"])] + [
        (name, k, r) for name, sched in res["schedules"].items() for k, r in enumerate(sched["runs"])
    ]
    for name, k, run in runs:
        c = run["engine"]
        cells = " ".join(f"{c[key]:9.2f}" for key in TIMING)
        print(
            f"  {name:24s} {k:3d} {run['tokens']:7d} {run['seconds']:7.2f} {run['tokens_per_s']:7.0f} "
            f"{c['seconds']:7.2f} {cells} {c['steps']:5d} {c['rows_per_step']:9.1f} {c['admissions']:6d}"
        )
    name, _, run = runs[-1]
    c = run["engine"]
    print(f"  {name}, last run, by bucket (GPU: the device's seconds in the steps' picks and forwards)")
    print(f"    {'rows':>6s} {'steps':>6s} {'seconds':>8s} {'GPU s':>8s} {'ms/step':>8s} {'GPU ms':>7s}")
    for rows, (steps, wall, gpu) in c["by_bucket"].items():
        print(
            f"    {rows:6d} {steps:6d} {wall:8.3f} {gpu:8.3f} {1e3 * wall / steps:8.2f} {1e3 * gpu / steps:7.2f}"
        )
    print(
        f"    {'admit':>6s} {c['admissions']:6d} {c['prefill_s']:8.3f} {c['prefill_gpu_s']:8.3f} "
        f"(prefill tokens {c.get('prefill_tokens', 0)}, reused {c.get('reused_tokens', 0)})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config/h200.yaml")
    p.add_argument("--data", type=Path, default=REPO / "results/data")
    p.add_argument(
        "--model",
        type=Path,
        help="a base model folder; default: the pipeline's build of the config's model "
        "(results/models/<model.name>), else the config's model.shape built here",
    )
    p.add_argument("--tokenizer", type=Path, help="with the shape built here: a saved tokenizer to reuse")
    p.add_argument("--modes", default="generation,episode")
    p.add_argument("--arms", default="base,merged")
    p.add_argument("--episode-model", choices=("merged", "base"), default="merged")
    p.add_argument(
        "--schedules",
        default="continuous",
        help="episode mode: continuous (the trainer's) and/or rounds (every ready turn in one batch)",
    )
    p.add_argument(
        "--admit",
        help="episode mode, continuous: SHARE:WAIT[,...] admission settings to run beside the engine's "
        "(arrivals join when they are SHARE of the running rows, or after WAIT steps)",
    )
    for name, default in dict(questions=32, samples=8, new=128, repeats=2).items():
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument(
        "--decode-attention",
        choices=("split", "flash"),
        help="the engine's decode-step attention (default: the engine's, split on a GPU)",
    )
    p.add_argument(
        "--no-shared-prefixes", action="store_true", help="every row reads its own copy of its prompt's keys"
    )
    p.add_argument("--no-fused", action="store_true", help="transformers' Qwen3 forward, not the fused one")
    p.add_argument(
        "--split-pick", action="store_true", help="the split-vocabulary pick, not the compiled torch one"
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--profile", type=Path, help="profile the last arm's last generation call into this file")
    p.add_argument(
        "--profile-episode",
        type=Path,
        help="one more rollout of the first schedule, under the profiler: its table into this file",
    )
    args = p.parse_args()
    cfg = parse_config(
        merged(read_yaml(REPO / "config/config.yaml"), read_yaml(args.config)), str(args.config)
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    claim = hold_gpu_memory()  # ATLAS_GPU_MEM_GB: the memory a pipeline job claims, as a stage holds it
    built = REPO / "results/models" / cfg.model.name
    if args.model is None and (built / "MANIFEST.json").is_file():
        args.model = built
    if args.model is not None:
        base, tokenizer = load_model(args.model, device)
    else:
        from atlas.model.shapes import model_tokenizer, shape_model

        if args.tokenizer is not None and (args.tokenizer / "tokenizer.json").exists():
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        else:
            tokenizer = model_tokenizer(cfg.model)
            if args.tokenizer is not None:
                tokenizer.save_pretrained(args.tokenizer)
        base = shape_model(cfg.model.shape, tokenizer, device=device)
    results = dict(command=" ".join(["scripts/bench_rollout.py", *sys.argv[1:]]), torch=torch.__version__)
    results |= dict(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        model=str(args.model) if args.model else cfg.model.shape,
        vocab=len(tokenizer),
        lora_rank=cfg.training.lora_rank,
        decode_attention=args.decode_attention or "the engine's default",
        shared_prefixes=not args.no_shared_prefixes,
        fused_forward=not args.no_fused,
        pick="split" if args.split_pick else "torch",
        gpu_memory_gb=claim,
    )
    policy = functools.cache(lambda: Policy(base, tokenizer, cfg, device))  # built once, if an arm needs it

    modes = args.modes.split(",")
    if "generation" in modes:
        results["generation"] = generation_mode(args, base, tokenizer, cfg, device, policy)
        print_generation(results["generation"])
    if "episode" in modes:
        results["episode"] = episode_mode(args, base, tokenizer, cfg, device, policy)
        print_episode(results["episode"])
    if "generation" in results and "episode" in results and "merged" in results["generation"]["arms"]:
        single = results["generation"]["arms"]["merged"]["tokens_per_s"]
        results["episode_vs_generation"] = results["episode"]["tokens_per_s"] / single
        for name, sched in results["episode"]["schedules"].items():
            sched["vs_generation"] = sched["tokens_per_s"] / single
            print(f"episode ({name}) / generation (merged) tokens/s: {sched['vs_generation']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
