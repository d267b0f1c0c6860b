"""Distributed roundtrip: a run's last compact checkpoint in an FSDP2-sharded policy, one step.

Started by torchrun (gloo on CPU, NCCL on GPUs), world size 2 in the pipeline:

    torchrun --standalone --nproc-per-node 2 -m atlas.checks.distributed --model results/models/tiny \
        --run-folder results/runs/<run> --training '{...}' --out <folder>

Each rank builds the policy, shards it with `fully_shard` (each decoder layer, then the LM, and
the value head), loads the checkpoint's full tensors into the shards
(`set_model_state_dict`), and runs one step on its half of a fixed batch (the run's first
training trajectories): the critic regresses the values toward each trajectory's score, the
actor takes a policy-gradient step on the sampled tokens with advantage = score - mean score
+- 1 (alternating by row, so the actor term is never zero),
each as a token mean over the *whole* batch (a rank scales its sum by world size / all tokens,
because FSDP averages gradients over ranks). Then:

  - the full gradients (gathered) are compared with one process taking the same step on the whole
    batch, unsharded: max abs difference against a tolerance of 1e-6 + 1e-5 * |g|. The terms are
    identical; only the order of float32 additions differs (two half-batch sums reduced, against
    one sum), and each addition rounds at 2^-24 relative, so differences stay around 1e-7
    relative; 1e-5 leaves room for a few hundred tokens of accumulated rounding, while a missing
    or doubled half-batch would be off by 50% or more;
  - after AdamW steps the sha256 of every full trainable tensor must agree across ranks; a rank
    that diverges fails the check with the tensor's name.

Each rank writes distributed_roundtrip_rank_<r>.json. `--perturb-rank R` shifts rank R's shards
of the actor before the step: a rank whose state diverged. Its shards feed every rank's forward,
so the gathered gradients leave the single-process ones and the check names the first tensor.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from atlas.checks.roundtrip import next_token_logprobs
from atlas.config import TrainingConfig
from atlas.hashing import atomic_write_json
from atlas.model.policy import ROLES, ActorCritic

ATOL, RTOL = 1e-6, 1e-5


def fixed_batch(trajectories: Path, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [rows, T], sampled mask [rows, T] and score [rows]: the first training trajectories,
    cut to the shortest so no padding enters the comparison."""
    table = [r for r in pq.read_table(trajectories).to_pylist() if r["phase"] == "train"][:rows]
    width = min(len(r["token_ids"]) for r in table)
    ids = torch.tensor([r["token_ids"][:width] for r in table])
    sampled = torch.tensor([r["sampled"][:width] for r in table], dtype=torch.float32)
    return ids, sampled, torch.tensor([r["score"] for r in table], dtype=torch.float32)


def losses(
    ac: ActorCritic, ids, sampled, score, adv, total_tokens: float, scale: float
) -> dict[str, torch.Tensor]:
    """Critic and actor losses of these rows, as their share of a token mean over all rows."""
    mask = sampled[:, 1:]
    adv = adv[:, None]
    out = {}
    with ac.role("critic"):
        v = ac.values(ids)[:, :-1]
        out["critic"] = ((v - score[:, None]) ** 2 * mask).sum() / total_tokens * scale
        out["critic"].backward()
    with ac.role("actor"):
        logp = next_token_logprobs(ac.actor_logits(ids), ids)
        out["actor"] = (-(adv * logp) * mask).sum() / total_tokens * scale
        out["actor"].backward()
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()


def build(model_dir: Path, training: TrainingConfig, seed: int) -> ActorCritic:
    return ActorCritic(AutoModelForCausalLM.from_pretrained(model_dir), training, seed=seed)


def checkpoint_tensors(run_folder: Path) -> tuple[dict[str, torch.Tensor], int, str]:
    index = json.loads((run_folder / "checkpoints.json").read_text(encoding="utf-8"))
    last = index["checkpoints"][-1]
    tensors = {}
    for role in ROLES:
        tensors.update(load_file(str(Path(last["path"]) / f"{role}.safetensors")))
    return tensors, last["step"], last["path"]


def load_full(ac: ActorCritic, tensors: dict[str, torch.Tensor]) -> None:
    """Full tensors into the (possibly sharded) policy; the value head is its own FSDP module."""
    peft_part = {n: t for n, t in tensors.items() if not n.startswith("value_head.")}
    head_part = {n.removeprefix("value_head."): t for n, t in tensors.items() if n.startswith("value_head.")}
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(ac.peft, peft_part, options=opts)
    set_model_state_dict(ac.value_head, head_part, options=StateDictOptions(full_state_dict=True))


def step_grads(ac, ids, sampled, score, adv, total, scale) -> dict[str, torch.Tensor]:
    losses(ac, ids, sampled, score, adv, total, scale)
    return {n: full(p.grad) for role in ROLES for n, p in ac.trainable(role).items()}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--run-folder", required=True, type=Path)
    ap.add_argument("--training", required=True, type=json.loads, help="the run's training config slice")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--perturb-rank", type=int, default=None)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # float32 matmuls in full precision on both sides of the comparison (no TF32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    training = TrainingConfig.model_validate({k: v for k, v in args.training.items() if k != "run"})
    tensors, step, path = checkpoint_tensors(args.run_folder)
    batch = fixed_batch(args.run_folder / "trajectories.parquet", rows=2 * world)
    ids, sampled, score = (t.to(device) for t in batch)
    total = float(sampled[:, 1:].sum())
    lr = {"actor": training.ppo.actor_lr, "critic": training.ppo.critic_lr}

    # The reference: one process, the whole batch, no sharding.
    ref = build(args.model, training, args.seed).to(device)
    load_full(ref, tensors)
    # The centred score, plus a fixed +-1 per row so the actor term never vanishes (equal scores).
    adv = score - score.mean() + torch.tensor([(-1.0) ** i for i in range(len(score))], device=device)
    ref_grads = step_grads(ref, ids, sampled, score, adv, total, 1.0)

    ac = build(args.model, training, args.seed).to(device)
    for layer in ac.peft.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(ac.peft)
    fully_shard(ac.value_head)
    load_full(ac, tensors)
    loaded = {n: full(p) for role in ROLES for n, p in ac.trainable(role).items()}
    mismatch = [n for n, t in loaded.items() if not torch.equal(t, tensors[n])]
    if rank == args.perturb_rank:
        with torch.no_grad():
            for p in ac.trainable("actor").values():
                p.to_local().add_(0.1)
    half = slice(rank * len(ids) // world, (rank + 1) * len(ids) // world)
    grads = step_grads(ac, ids[half], sampled[half], score[half], adv[half], total, float(world))
    excess = {
        n: ((grads[n] - ref_grads[n]).abs() - RTOL * ref_grads[n].abs()).max().item() for n in sorted(grads)
    }
    off = [n for n, e in excess.items() if e > ATOL]
    max_abs = max((grads[n] - ref_grads[n]).abs().max().item() for n in grads)
    for role in ROLES:
        opt = torch.optim.AdamW(list(ac.trainable(role).values()), lr=lr[role])
        opt.step()
    digests = {n: digest(full(p)) for role in ROLES for n, p in sorted(ac.trainable(role).items())}
    everyone: list[dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(everyone, digests)
    diverged = sorted(n for n in digests if len({d[n] for d in everyone}) > 1)
    record = {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "checkpoint": path,
        "step": step,
        "batch_rows": int(len(ids)),
        "rows_on_this_rank": int(ids[half].shape[0]),
        "tokens": total,
        "loaded_tensors_equal": not mismatch,
        "grad_max_abs_diff_vs_single_process": max_abs,
        "tolerance": {"atol": ATOL, "rtol": RTOL},
        "grads_within_tolerance": not off,
        "tensors_out_of_tolerance": off[:10],
        "parameter_digest": hashlib.sha256("".join(digests[n] for n in sorted(digests)).encode()).hexdigest(),
        "digests_agree_across_ranks": not diverged,
        "diverged_tensors": diverged[:10],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"distributed_roundtrip_rank_{rank}.json", record)
    dist.destroy_process_group()
    problems = []
    if mismatch:
        problems.append(
            f"rank {rank}: tensor {mismatch[0]} differs from {path} after loading into the shards"
        )
    if off:
        problems.append(
            f"rank {rank}: gradient of {off[0]} differs from the single-process step beyond "
            f"{ATOL} + {RTOL} * |g| ({len(off)} tensors; max abs diff {max_abs:.3g})"
        )
    if diverged:
        problems.append(f"rank {rank}: tensor {diverged[0]} differs across ranks after the step")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        raise SystemExit(1)
    print(
        f"rank {rank}: ok, grad max abs diff {max_abs:.3g}, digest {record['parameter_digest'][:16]}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
