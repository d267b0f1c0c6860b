#!/usr/bin/env python
"""The report's perf tests on one GPU: full-batch step, split stress check, GPU data check.

    python scripts/bench_gpu_perf.py --shape 1.7b --tokenizer .gpu/tokenizer --out $OUT/perf_1.7b.json

The policy of training (atlas.model.policy.ActorCritic on a random-init Qwen3 of the shape in
bf16, vocab 151,936, actor and critic LoRA r64/a128 on all linear layers, the value head), the
synthetic 151,936-token tokenizer, and the efficient update path: rows packed per micro-batch of
at most `--micro-tokens` tokens (atlas.rl.packing, varlen FlashAttention-2), log-probs from the
chunked head under the grammar masks (atlas.rl.fused_head), adapters in bf16 through one addmm
(atlas.model.fused_lora), Liger's RMSNorm / RoPE / SwiGLU kernels (after generation), gradient
checkpointing on every decoder layer, AdamW per role (atlas.rl.ppo.make_optimizers, PPOConfig's
defaults: one epoch, one mini-batch, KL k3 in the actor loss).

full_batch    one step of 32 questions x 8 responses: generation by StaticEngine with the call
              grammar (after one untimed warm-up call that compiles it; the update's kernels are
              warmed up on a small synthetic batch too, also untimed), the grammar masks
              replayed (atlas.rl.replay.replay_masks), old log-probs, reference log-probs
              (adapters off), values, GAE, critic update, actor update, compact save
              (atlas.rl.checkpoint.save_compact). Prompts are synthetic chat turns ("Question i"
              with the GPQA or LCB tools), rewards synthetic (0/1 on each row's last token).
split_stress  8 rows of 24,576 synthetic tokens x 2 steps (the last 24,064 of each row scored
              under synthetic masks), every phase of the update, micro-batches of whole rows.
data_check    128 full-length rows (5,154 synthetic tokens, the report's longest row) scored
              in packed micro-batches, then again as 128 single-row micro-batches: the largest
              log-prob difference between the two (bf16: kernels of other shapes round otherwise).

Every phase is timed with the device synchronised and its peak allocated memory read; nvidia-smi
is sampled in a background thread the whole time. Writes JSON: `perf_stack` rows, and
`timing_analysis` (phase times, memory peaks, the samples and their summary per phase).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_checkpoint import folder_bytes  # noqa: E402
from bench_gpu_rollout import SHAPES, VOCAB, build_model, chat_requests, rt_cfg  # noqa: E402
from bench_gpu_update import apply_liger, base_parameters, synthetic_masks  # noqa: E402

from atlas.config import PPOConfig, TrainingConfig  # noqa: E402
from atlas.hashing import atomic_write_json  # noqa: E402
from atlas.model.fused_lora import fused_lora  # noqa: E402
from atlas.model.policy import ActorCritic  # noqa: E402
from atlas.rl.advantages import gae_over_sampled_batch  # noqa: E402
from atlas.rl.checkpoint import save_compact  # noqa: E402
from atlas.rl.losses import kl_penalty, masked_mean, policy_loss, value_loss  # noqa: E402
from atlas.rl.packing import packed_attention  # noqa: E402
from atlas.rl.ppo import Batch, Passes, make_optimizers, make_schedulers  # noqa: E402
from atlas.rl.replay import replay_masks  # noqa: E402

SMI_FIELDS = "timestamp,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Sampler:
    """nvidia-smi readings every `interval_ms`, each tagged with the phase running when it came."""

    def __init__(self, interval_ms: int):
        self.phase = "setup"
        self.samples: list[dict] = []
        self.proc = None
        if shutil.which("nvidia-smi") is None:
            return
        self.proc = subprocess.Popen(
            [
                "nvidia-smi",
                f"--query-gpu={SMI_FIELDS}",
                "--format=csv,noheader,nounits",
                f"-lms={interval_ms}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        names = SMI_FIELDS.split(",")
        for line in self.proc.stdout:
            values = [v.strip() for v in line.split(",")]
            if len(values) != len(names):
                continue
            row = {"phase": self.phase, "timestamp": values[0]}
            for name, v in zip(names[1:], values[1:], strict=True):
                with contextlib.suppress(ValueError):
                    row[name] = float(v)
            self.samples.append(row)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.thread.join(timeout=10)

    def by_phase(self) -> dict:
        out: dict[str, dict] = {}
        for phase in dict.fromkeys(s["phase"] for s in self.samples):
            rows = [s for s in self.samples if s["phase"] == phase]

            def col(name, rows=rows):
                return [r[name] for r in rows if name in r]

            out[phase] = {
                "samples": len(rows),
                "utilization_gpu_mean": statistics.fmean(col("utilization.gpu") or [0]),
                "memory_used_mib_max": max(col("memory.used") or [0]),
                "power_draw_w_max": max(col("power.draw") or [0]),
                "power_draw_w_mean": statistics.fmean(col("power.draw") or [0]),
                "clocks_sm_mhz_mean": statistics.fmean(col("clocks.sm") or [0]),
                "temperature_gpu_max": max(col("temperature.gpu") or [0]),
            }
        return out


class Phases:
    """Timed phases: seconds with the device synchronised, peak allocated memory, tokens."""

    def __init__(self, sampler: Sampler, cuda: bool):
        self.sampler, self.cuda, self.rows = sampler, cuda, []

    @contextlib.contextmanager
    def __call__(self, test: str, phase: str, tokens: int | None, step: int = 1):
        self.sampler.phase = f"{test}/{phase}"
        sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        yield
        sync()
        seconds = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None
        self.rows.append(
            {
                "test": test,
                "phase": phase,
                "step": step,
                "seconds": seconds,
                "tokens": tokens,
                "peak_gb": peak,
            }
        )
        print(f"{test:12s} step {step} {phase:14s} {seconds:8.2f} s  peak {peak or 0:6.1f} GiB", flush=True)
        self.sampler.phase = f"{test}/between"


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive rows while their tokens fit `budget` (a longer row goes alone)."""
    out, cur, used = [], [], 0
    for i, n in enumerate(lengths):
        if cur and used + n > budget:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    return out + ([cur] if cur else [])


class Policy:
    """The forward passes of the update on packed micro-batches (atlas.rl.ppo.Passes, packed),
    micro-batches cut by a token budget."""

    def __init__(self, ac: ActorCritic, ppo: PPOConfig, temperature: float, micro_tokens: int):
        self.ac, self.ppo, self.temperature, self.micro_tokens = ac, ppo, temperature, micro_tokens
        self.passes = Passes(ac, temperature, packed=True)

    def chunks(self, batch: Batch) -> list[list[int]]:
        return micro_batches(batch.attention.sum(-1).tolist(), self.micro_tokens)

    def logprobs(self, sub: Batch) -> torch.Tensor:
        return self.passes.logprobs(sub)[0]

    def values(self, sub: Batch) -> torch.Tensor:
        """V of the state before token t (the critic's output at t - 1), as ppo.aligned_values."""
        return self.passes.values(sub)

    def sync_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Before clipping: nothing on one process (bench_gpu_dp averages over ranks here)."""

    @torch.no_grad()
    def score(self, batch: Batch, what: str) -> torch.Tensor:
        self.ac.eval()
        out = torch.zeros_like(batch.sampled)
        for idx in self.chunks(batch):
            sub = batch.rows(idx)
            if what == "old_log_prob":
                with self.ac.role("actor"):
                    out[idx] = self.logprobs(sub)
            elif what == "ref":
                with self.ac.peft.disable_adapter():
                    out[idx] = self.logprobs(sub)
            else:
                with self.ac.role("critic"):
                    out[idx] = self.values(sub) * sub.sampled
        return out

    def update(self, role: str, batch: Batch, prep: dict, opt, step: bool = True) -> dict:
        """One optimizer step of `role` over the batch (PPOConfig's one epoch, one mini-batch),
        micro-batch gradients weighted by their share of the sampled tokens, as ppo.update.
        step=False: forward and backward only (the warm-up), gradients dropped."""
        ppo, mask = self.ppo, batch.sampled
        self.ac.train()
        opt.zero_grad(set_to_none=True)
        tokens = mask.sum()
        for idx in self.chunks(batch):
            sub = batch.rows(idx)
            weight = (mask[idx].sum() / tokens).item()
            with self.ac.role(role):
                if role == "critic":
                    out = value_loss(
                        self.values(sub),
                        prep["values"][idx],
                        prep["returns"][idx],
                        sub.sampled,
                        ppo.cliprange_value,
                    )
                    loss = out["critic/vf_loss"]
                else:
                    lp = self.logprobs(sub)
                    out = policy_loss(
                        lp,
                        prep["old"][idx],
                        prep["advantages"][idx],
                        sub.sampled,
                        ppo.clip_ratio_low,
                        ppo.clip_ratio_high,
                        ppo.clip_ratio_c,
                    )
                    kl = masked_mean(kl_penalty(lp, prep["ref"][idx], ppo.kl_kind), sub.sampled)
                    loss = out["actor/pg_loss"] + ppo.kl_coef * kl
                (loss * weight).backward()
        params = list(self.ac.trainable(role).values())
        self.sync_grads(params)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, ppo.grad_clip).item()
        if step:
            opt.step()
        opt.zero_grad(set_to_none=True)
        self.ac.eval()
        return {"loss": loss.item(), "grad_norm": grad_norm}


def ppo_step(test, step, policy, batch, optimizers, ppo, phases, rollout: bool) -> dict:
    """old log-probs, reference, values, GAE, critic update, actor update: each a timed phase.
    rollout: the batch's rollout log-probs are real (the engine's), so compare them."""
    tokens = int(batch.attention.sum())
    with phases(test, "old_log_prob", tokens, step):
        old = policy.score(batch, "old_log_prob")
    with phases(test, "ref", tokens, step):
        ref = policy.score(batch, "ref")
    with phases(test, "values", tokens, step):
        values = policy.score(batch, "values")
    with phases(test, "adv", tokens, step):
        advantages, returns = gae_over_sampled_batch(
            batch.rewards, values, batch.sampled, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages
        )
    prep = {"old": old, "ref": ref, "values": values, "advantages": advantages, "returns": returns}
    with phases(test, "update_critic", tokens, step):
        critic = policy.update("critic", batch, prep, optimizers["critic"])
    with phases(test, "update_actor", tokens, step):
        actor = policy.update("actor", batch, prep, optimizers["actor"])
    out = {"critic": critic, "actor": actor}
    if rollout:  # StaticEngine's decode (bf16) against the packed update path (bf16)
        gap = (old - batch.rollout_logprobs).abs() * batch.sampled
        out["rollout_vs_old_logprob_max_abs_diff"] = gap.max().item()
        out["rollout_vs_old_logprob_mean_abs_diff"] = (gap.sum() / batch.sampled.sum()).item()
    return out


def warm_up(policy: Policy, optimizers, device: str) -> None:
    """Every forward and backward of the update once on a small batch, no optimizer step: the
    Liger kernels' JIT compilation and first allocations stay out of the timed phases."""
    batch = synthetic_batch(2, 1024, 512, device, seed=7)
    prep = {"old": policy.score(batch, "old_log_prob"), "ref": policy.score(batch, "ref")}
    prep["values"] = policy.score(batch, "values")
    prep["advantages"], prep["returns"] = batch.rewards, batch.rewards
    for role in ("critic", "actor"):
        policy.update(role, batch, prep, optimizers[role], step=False)


def generation_batch(rt, requests, gens, device) -> Batch:
    """Prompt + generated tokens per row, right-padded; grammar masks replayed per generation."""
    rows = [r.prompt_ids + g.token_ids for r, g in zip(requests, gens, strict=True)]
    width = max(map(len, rows))
    n = len(rows)
    ids = torch.zeros((n, width), dtype=torch.long)
    attn, sampled, logprobs, rewards = (torch.zeros((n, width)) for _ in range(4))
    # replay_masks reads the grammar of each span through rt.grammars.get(span.offered): here the
    # span carries the request's compiled grammar itself
    by_grammar = SimpleNamespace(get=lambda compiled: compiled, banned_token_ids=rt.grammars.banned_token_ids)
    replay_rt = SimpleNamespace(engine=rt.engine, grammars=by_grammar)
    masks = []
    g = torch.Generator().manual_seed(0)
    for i, (r, gen, row) in enumerate(zip(requests, gens, rows, strict=True)):
        start, end = len(r.prompt_ids), len(row)
        ids[i, :end] = torch.tensor(row)
        attn[i, :end] = 1
        sampled[i, start:end] = torch.tensor(gen.sampled, dtype=torch.float32)
        logprobs[i, start:end] = torch.tensor(gen.logprobs)
        last_sampled = start + max(k for k, s in enumerate(gen.sampled) if s) if any(gen.sampled) else None
        if last_sampled is not None:  # synthetic 0/1 reward on the row's last sampled token
            rewards[i, last_sampled] = float(torch.rand((), generator=g) < 0.5)
        episode = SimpleNamespace(
            generations=[SimpleNamespace(start=start, end=end, offered=r.grammar)],
            token_ids=row,
            question={"question_uid": f"synthetic:{i}"},
            sample=i,
        )
        masks.append(replay_masks(episode, replay_rt))
    dev = torch.device(device)
    return Batch(ids.to(dev), attn.long().to(dev), sampled.to(dev), logprobs.to(dev), rewards.to(dev), masks)


def synthetic_batch(rows: int, length: int, prompt: int, device: str, seed: int) -> Batch:
    """Random token rows of one length; tokens after `prompt` are sampled and scored."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, length), generator=g, device=device)
    masks = []
    for m in synthetic_masks(ids, seed):  # every token after the first; keep those after `prompt`
        keep = m.positions >= prompt
        masks.append(SimpleNamespace(positions=m.positions[keep], bitmask=m.bitmask[keep.to(device)]))
    sampled = torch.zeros(ids.shape, device=device)
    sampled[:, prompt:] = 1
    rewards = torch.zeros(ids.shape, device=device)
    rewards[:, -1] = (torch.rand(rows, generator=g, device=device) < 0.5).float()
    return Batch(ids, torch.ones_like(ids), sampled, torch.zeros_like(sampled), rewards, masks)


def perf_rows(rows: list[dict], device: str, shape: str) -> list[dict]:
    """perf_stack rows: per test and phase, the median seconds and tokens over its steps."""
    out = []
    for key in dict.fromkeys((r["test"], r["phase"]) for r in rows):
        runs = [r for r in rows if (r["test"], r["phase"]) == key]
        seconds = [r["seconds"] for r in runs]
        tokens = [r["tokens"] for r in runs if r["tokens"] is not None]
        out.append(
            {
                "source": "committed",
                "test": key[0],
                "run": "bench",
                "device": device,
                "model_shape": shape,
                "phase": key[1],
                "steps": len(runs),
                "seconds": statistics.median(seconds),
                "tokens": int(statistics.median(tokens)) if tokens else None,
                "tokens_per_s": sum(tokens) / sum(seconds) if tokens and sum(seconds) else None,
                "peak_memory_gb": max((r["peak_gb"] for r in runs if r["peak_gb"] is not None), default=None),
                "checkpoint_bytes": next((r["bytes"] for r in runs if "bytes" in r), None),
                "checkpoint_save_s": statistics.median(seconds) if key[1] == "save_checkpoint" else None,
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    p.add_argument("--tokenizer", type=Path, default=Path(".gpu/tokenizer"))
    p.add_argument("--lora", type=int, default=64)
    p.add_argument("--questions", type=int, default=32)
    p.add_argument("--responses", type=int, default=8)
    p.add_argument("--new", type=int, default=512, help="generation cap per response")
    p.add_argument("--micro-tokens", type=int, default=32_768, help="token budget of a micro-batch")
    p.add_argument("--stress-rows", type=int, default=8)
    p.add_argument("--stress-tokens", type=int, default=24_576)
    p.add_argument("--stress-steps", type=int, default=2)
    p.add_argument("--data-rows", type=int, default=128)
    p.add_argument("--data-tokens", type=int, default=5_154)
    p.add_argument("--tests", default="full_batch,split_stress,data_check")
    p.add_argument("--no-liger", action="store_true")
    p.add_argument("--smi-ms", type=int, default=500)
    p.add_argument("--device", default="cuda", help="cpu only to try the script out")
    p.add_argument("--dir", type=Path, default=Path("/tmp/atlas_perf_ckpt"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    tests = args.tests.split(",")
    cuda = args.device == "cuda"
    from transformers import AutoTokenizer

    from atlas.runtime.fast_engine import StaticEngine
    from atlas.runtime.session import make_runtime

    sampler = Sampler(args.smi_ms)
    phases = Phases(sampler, cuda)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    base = build_model(tokenizer, args.shape, torch.bfloat16 if cuda else torch.float32, 0, args.device)
    training = TrainingConfig(
        responses_per_question=args.responses,
        lora_rank=args.lora,
        lora_alpha=2 * args.lora,
        lora_targets="all-linear",
    )
    ac = ActorCritic(base, training, seed=0).to(args.device).eval()
    ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ppo = PPOConfig()
    optimizers = make_optimizers(ac, ppo)
    schedulers = make_schedulers(optimizers, ppo, 1)
    policy = Policy(ac, ppo, rt_cfg().temperature, args.micro_tokens)
    device_name = torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"
    shape = f"qwen3 {args.shape} v{VOCAB} lora r{args.lora}"
    results = {
        "command": " ".join(sys.argv),
        "device": device_name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "shape": args.shape,
        "vocab": VOCAB,
        "lora_rank": args.lora,
        "base_parameters": base_parameters(base),
        "micro_tokens": args.micro_tokens,
        "update_path": "packed rows + varlen FlashAttention-2, chunked head under grammar masks, "
        "fused bf16 LoRA, "
        + ("no Liger" if args.no_liger else "Liger RMSNorm/RoPE/SwiGLU")
        + ", gradient checkpointing every layer",
        "synthetic": "random-init weights; full_batch prompts are synthetic chat turns with the real "
        "tool lists and grammars, rewards random 0/1 on each row's last sampled token; split_stress "
        "and data_check rows are random token ids scored under random bitmasks (~90% allowed)",
        "tests": {},
    }

    if "full_batch" in tests:
        rt = make_runtime(ac.peft, tokenizer, rt_cfg())
        engine = StaticEngine(
            ac.peft,
            rt.engine.vocab_size,
            rt.engine.stop_token_ids,
            rt.engine.pad_token_id,
            temperature=rt_cfg().temperature,
            banned_token_ids=rt.grammars.banned_token_ids,
        )
        prompts = chat_requests(rt, args.questions, args.new)
        requests = [
            dataclasses.replace(r, seed=1000 * q + k)
            for q, r in enumerate(prompts)
            for k in range(args.responses)
        ]
        with phases("full_batch", "gen_warmup", None):
            engine.generate(requests)  # compiles the decode step and captures its graphs
        with phases("full_batch", "gen", None):
            gens = engine.generate(requests)
        phases.rows[-1]["tokens"] = sum(len(g.token_ids) for g in gens)
        with phases("full_batch", "replay_masks", None):
            batch = generation_batch(rt, requests, gens, args.device)
        del engine
        if cuda:
            torch.cuda.empty_cache()
        lengths = batch.attention.sum(-1).tolist()
        results["tests"]["full_batch"] = {
            "rows": len(requests),
            "tokens": int(sum(lengths)),
            "generated_tokens": sum(len(g.token_ids) for g in gens),
            "sampled_tokens": int(batch.sampled.sum()),
            "longest_row": max(lengths),
            "finish_reasons": {k: sum(g.finish_reason == k for g in gens) for k in ("stop", "length")},
            "micro_batches": len(policy.chunks(batch)),
        }
    with contextlib.ExitStack() as stack:
        stack.enter_context(packed_attention(ac.peft))
        stack.enter_context(fused_lora(ac.peft))
        if not args.no_liger and cuda:
            apply_liger(base)
        with phases("setup", "update_warmup", None):
            warm_up(policy, optimizers, args.device)
        if "full_batch" in tests:
            out = ppo_step("full_batch", 1, policy, batch, optimizers, ppo, phases, rollout=True)
            with phases("full_batch", "save_checkpoint", None):
                shutil.rmtree(args.dir, ignore_errors=True)
                folder = save_compact(args.dir, 1, ac, optimizers, schedulers, {"bench": True})
            phases.rows[-1]["bytes"] = folder_bytes(folder)
            shutil.rmtree(args.dir, ignore_errors=True)
            step_rows = [
                r for r in phases.rows if r["test"] == "full_batch" and not r["phase"].endswith("warmup")
            ]
            results["tests"]["full_batch"].update(out, step_seconds=sum(r["seconds"] for r in step_rows))
            print(f"full batch step: {results['tests']['full_batch']['step_seconds']:.1f} s", flush=True)
            del batch

        if "split_stress" in tests:
            record = results["tests"]["split_stress"] = {
                "rows": args.stress_rows,
                "row_tokens": args.stress_tokens,
                "steps": [],
            }
            for step in range(1, args.stress_steps + 1):
                stress = synthetic_batch(args.stress_rows, args.stress_tokens, 512, args.device, seed=step)
                record["micro_batches_per_pass"] = len(policy.chunks(stress))
                record["steps"].append(
                    ppo_step("split_stress", step, policy, stress, optimizers, ppo, phases, rollout=False)
                )
                del stress

        if "data_check" in tests:
            data = synthetic_batch(args.data_rows, args.data_tokens, 1, args.device, seed=99)
            tokens = args.data_rows * args.data_tokens
            with phases("data_check", "full_batch_logprob", tokens):
                full = policy.score(data, "old_log_prob")
            with phases("data_check", "single_row_logprob", tokens), torch.no_grad(), ac.role("actor"):
                single = torch.zeros_like(full)
                for i in range(args.data_rows):
                    single[i : i + 1] = policy.logprobs(data.rows([i]))
            diff = (full - single).abs() * data.sampled
            results["tests"]["data_check"] = {
                "rows": args.data_rows,
                "row_tokens": args.data_tokens,
                "full_batch_micro_batches": len(policy.chunks(data)),
                "single_row_micro_batches": args.data_rows,
                "logprob_max_abs_diff": diff.max().item(),
                "logprob_mean_abs_diff": (diff.sum() / data.sampled.sum()).item(),
                "rows_bitwise_equal": int(((full == single) | (data.sampled == 0)).all(-1).sum()),
            }
            print("data check:", results["tests"]["data_check"], flush=True)
    sampler.stop()

    timed = [r for r in phases.rows if not r["phase"].endswith("warmup")]
    results["perf_stack"] = perf_rows(timed, device_name, shape)
    results["timing_analysis"] = {
        "device": device_name,
        "phases": phases.rows,
        "memory_peak_gb": max((r["peak_gb"] or 0) for r in phases.rows) if phases.rows else None,
        "nvidia_smi_fields": SMI_FIELDS,
        "nvidia_smi_interval_ms": args.smi_ms,
        "nvidia_smi_by_phase": sampler.by_phase(),
        "nvidia_smi_samples": sampler.samples,
    }
    print("| test | phase | steps | s (median) | tokens | peak GiB |\n|---|---|---|---|---|---|")
    for r in results["perf_stack"]:
        print(
            f"| {r['test']} | {r['phase']} | {r['steps']} | {r['seconds']:.2f} | {r['tokens'] or ''} | "
            f"{r['peak_memory_gb'] or 0:.1f} |"
        )
    if args.out:
        atomic_write_json(args.out, results)


if __name__ == "__main__":
    main()
