"""CPU roundtrip of a compact checkpoint, and the batch arithmetic of a run's steps.

cpu_roundtrip, for each checkpoint step_k of a run:
    load it into a fresh policy (A); every tensor bit-equal to the file and finite;
    save A again and load that into another fresh policy (B): tensors, and the actor's log-probs
    and the critic's values on a fixed probe batch, bit-equal between A and B;
    resume from A: the next step (k) gives exactly the metrics the run journaled for step k
    (measured columns, timing_s/* and perf/*, left out).

policy_roundtrip is the same without the resumed step, for a verl run: its optimizer and RNG
states live in verl's own checkpoints (verl resumes from those), and its policy checkpoints hold
the trainable tensors alone.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from atlas.contracts.parquet import read_table
from atlas.errors import CheckFailed
from atlas.model.policy import ROLES, ActorCritic
from atlas.rl.checkpoint import load_compact, load_trainable, save_compact, save_trainable


def probe_batch(trajectories: Path, rows: int = 2) -> torch.Tensor:
    """The first `rows` training trajectories of the run, cut to the shortest: [rows, T] ids."""
    table = read_table(trajectories).to_pylist()
    picked = [r["token_ids"] for r in table if r["phase"] == "train"][:rows]
    width = min(len(ids) for ids in picked)
    return torch.tensor([ids[:width] for ids in picked])


def next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1] log p(ids[:, t+1]) under the full (unmasked) distribution at t. The checks use
    it as a plain probe of the weights; training uses the grammar-masked log-probs instead."""
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def probes(ac: ActorCritic, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The actor's log-probs and the critic's values on `ids`, computed on the policy's device
    and returned on the CPU, whatever device `ids` is on."""
    ids = ids.to(policy_device(ac))
    with torch.no_grad():
        return {
            "actor_logprobs": next_token_logprobs(ac.actor_logits(ids), ids).cpu(),
            "critic_values": ac.values(ids).cpu(),
        }


def policy_device(ac: ActorCritic) -> torch.device:
    return next(ac.peft.parameters()).device


def tensors_match_file(ac: ActorCritic, folder: Path) -> int:
    n = 0
    for role in ROLES:
        path = folder / f"{role}.safetensors"
        saved, live = load_file(str(path)), ac.trainable(role)
        for name, t in saved.items():
            if not torch.isfinite(t).all():
                raise CheckFailed(f"{path}: tensor {name} has non-finite values")
            if not torch.equal(live[name].detach().cpu(), t):
                raise CheckFailed(f"{path}: tensor {name} differs after loading it")
            n += 1
    return n


def measured(name: str) -> bool:
    return name.startswith(("timing_s/", "perf/"))


# A resumed step's metrics on a GPU: float32 reductions that run in another order from one process
# to the next, so equal only to about 1e-7 relative (3e-5 seen on an H200).
GPU_METRIC_REL_TOL = 1e-4
# Metrics that are means of differences of two log-probs of the same tokens (rollout engine and
# update, old and new policy, policy and reference): near 0 themselves, they move with the
# rounding of log-probs of order 1, so on a GPU they are compared on that scale, within rel_tol
# absolute (an H200 gave rollout/logprob_gap_mean 0.0013337965 resumed, 0.0013327865 logged). The
# importance ratios are exponentials of the same differences, and their shares outside the band
# count tokens whose ratio the rounding can carry across it.
LOGPROB_DIFFERENCES = (
    "rollout/logprob_gap_",
    "rollout/importance_ratio",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/reward_kl_penalty",
)


def metric_rel_tol(device: torch.device) -> float:
    """The relative tolerance of a resumed step's metrics on `device`: 0 (equal) but on CUDA."""
    return GPU_METRIC_REL_TOL if device.type == "cuda" else 0.0


def same_metrics(
    got: dict[str, float], want: dict[str, float | None], where: str, rel_tol: float = 0.0
) -> int:
    """Compare every computed metric; `want` comes from step_metrics.parquet, where a metric the
    step did not have (no LCB question that step: no completed/lcb) is null. With rel_tol 0 (a
    CPU) each must be equal; with rel_tol > 0 (a GPU) within rel_tol, or rel_tol / 100 absolute
    for a metric near 0 (rel_tol for LOGPROB_DIFFERENCES), and the largest share of that
    tolerance a metric used is printed. Every metric that differs is named in one error."""
    keys = sorted(k for k in want if "/" in k and not measured(k))  # metrics, not run / step
    used, furthest = 0.0, None  # the tolerance's share used by the metric furthest from its value
    differ = []
    for k in keys:
        a, b = got.get(k), want[k]
        if b is None:
            if a is not None:
                differ.append(f"metric {k} is {a!r} after resuming, the run had none")
            continue
        if a is not None and (a == b or (math.isnan(a) and math.isnan(b))):
            continue
        floor = rel_tol if k.startswith(LOGPROB_DIFFERENCES) else rel_tol / 100
        if a is not None and rel_tol > 0 and math.isclose(a, b, rel_tol=rel_tol, abs_tol=floor):
            share = abs(a - b) / max(rel_tol * abs(b), floor)
            if share > used:
                used, furthest = share, k
            continue
        within = f" (rel_tol {rel_tol})" if rel_tol else ""
        differ.append(f"metric {k} is {a!r} after resuming, the run logged {b!r}{within}")
    if differ:
        raise CheckFailed(f"{where}: " + "; ".join(differ))
    if rel_tol > 0:
        print(
            f"{where}: {len(keys)} metrics within rel_tol {rel_tol}, using at most {used:.2g} of it"
            + (f" ({furthest})" if furthest else ""),
            flush=True,
        )
    return len(keys)


def cpu_roundtrip(
    open_fresh, folder: Path, step: int, next_metrics: dict | None, ids: torch.Tensor, train_step
) -> dict:
    """`open_fresh()` gives a new training session (atlas.rl.step.Session); `train_step(sess, k)`
    runs step k; `next_metrics` are the journaled metrics of step `step` (None: no resumed step,
    after the last checkpoint or past checks.resumed_steps)."""
    a = open_fresh()
    state = load_compact(folder, a.ac, a.optimizers, a.schedulers)
    if state["step"] != step:
        raise CheckFailed(f"{folder / 'state.json'}: step {state['step']}, expected {step}")

    def save_load(tmp: str) -> ActorCritic:
        again = save_compact(tmp, step, a.ac, a.optimizers, a.schedulers, state["extra"])
        b = open_fresh()
        load_compact(again, b.ac, b.optimizers, b.schedulers)
        return b.ac

    checked = _save_load_probes(a.ac, folder, ids, save_load)
    resumed = tol = None  # no resumed step: neither a count nor a tolerance
    if next_metrics is not None:
        load_compact(folder, a.ac, a.optimizers, a.schedulers)  # the RNGs as saved, again
        _, metrics = train_step(a, step)
        tol = metric_rel_tol(policy_device(a.ac))
        resumed = same_metrics(metrics, next_metrics, f"{folder}: resuming into step {step}", tol)
    return _record(step, folder, checked, ids, resumed, tol)


def _record(
    step: int, folder: Path, checked: int, ids: torch.Tensor, resumed: int | None, rel_tol: float | None
) -> dict:
    """A checkpoint's cpu_roundtrip.json entry, once every check above it has passed."""
    return {
        "step": step,
        "checkpoint": folder.as_posix(),
        "tensors_bit_equal": checked,
        "all_finite": True,
        "probe_rows": int(ids.shape[0]),
        "probe_tokens": int(ids.numel()),
        "probe_logprobs_equal": True,
        "probe_values_equal": True,
        "next_step_metrics_equal": resumed,  # number of metrics compared; None if not resumed
        "next_step_metrics_rel_tol": rel_tol,  # how: 0.0 equal (a CPU), else within it (a GPU)
    }


def _save_load_probes(a: ActorCritic, folder: Path, ids: torch.Tensor, save_load) -> int:
    """A's tensors equal the file's; `save_load(tmp)` saves A and loads that into a fresh policy
    B, whose tensors and probes must equal A's. Returns the number of tensors checked."""
    checked = tensors_match_file(a, folder)
    before = probes(a, ids)
    with tempfile.TemporaryDirectory(prefix="atlas-roundtrip-") as tmp:
        b = save_load(tmp)
        tensors_match_file(b, folder)
        after = probes(b, ids)
    for key in before:
        if not torch.equal(before[key], after[key]):
            diff = (before[key] - after[key]).abs().max().item()
            raise CheckFailed(
                f"{folder}: {key} on the probe batch differ after a save/load roundtrip (max {diff})"
            )
    return checked


def policy_roundtrip(fresh_policy, folder: Path, step: int, ids: torch.Tensor) -> dict:
    """`fresh_policy()` gives a new ActorCritic; `folder` holds {actor,critic}.safetensors only."""
    a = fresh_policy()
    load_trainable(folder, a)

    def save_load(tmp: str) -> ActorCritic:
        save_trainable(Path(tmp), a)
        b = fresh_policy()
        load_trainable(tmp, b)
        return b

    # no resumed step: verl resumes from its own checkpoints, not these
    return _record(step, folder, _save_load_probes(a, folder, ids, save_load), ids, None, None)


def batch_math(records, trajectories, *, steps: int, questions: int, responses: int, ppo) -> list[dict]:
    """Per step: questions, trajectories, generations, tokens, mini-batches, micro-batches and
    optimizer steps, checked against the config (the report: 32 x 8 -> 256 trajectories)."""
    rows = []
    for k in range(steps):
        recs = [r for r in records if r["phase"] == "train" and r["step"] == k]
        trajs = [t for t in trajectories if t["phase"] == "train" and t["step"] == k]
        n_q = len({r["question_uid"] for r in trajs})
        n_t = len(trajs)
        where = f"batch_math: step {k}"
        if n_q != questions:
            raise CheckFailed(f"{where}: {n_q} questions, the config says {questions}")
        if n_t != questions * responses:
            raise CheckFailed(
                f"{where}: {n_t} trajectories, the config says {questions} x {responses} = {questions * responses}"
            )
        if len(recs) != sum(t["turns"] for t in trajs):
            raise CheckFailed(
                f"{where}: {len(recs)} records for {sum(t['turns'] for t in trajs)} generations"
            )
        mini = -(-n_t // ppo.mini_batches)
        micro_per_mini = -(-mini // ppo.micro_batch_size)
        rows.append(
            {
                "step": k,
                "questions": n_q,
                "responses_per_question": responses,
                "trajectories": n_t,
                "generations": len(recs),
                "tokens": sum(len(t["token_ids"]) for t in trajs),
                "sampled_tokens": sum(sum(t["sampled"]) for t in trajs),
                "epochs": ppo.epochs,
                "mini_batches": ppo.mini_batches,
                "trajectories_per_mini_batch": mini,
                "micro_batches": ppo.epochs * ppo.mini_batches * micro_per_mini,
                "micro_batch_size": ppo.micro_batch_size,
                "optimizer_steps_per_role": ppo.epochs * ppo.mini_batches,
            }
        )
    return rows
