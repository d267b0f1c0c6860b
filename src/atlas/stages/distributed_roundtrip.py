"""Distributed roundtrip stage: a run's last compact checkpoint in an FSDP2-sharded policy, one
step on each rank, compared with one process taking the same step (see atlas.checks.distributed).

    torchrun --standalone --nproc-per-node 2 -m atlas.stages.distributed_roundtrip \
        --config-slice '{...}' --model results/models/tiny --run-folder results/runs/<run> --out <folder>

Each rank writes distributed_roundtrip_rank_<r>.json and exits 1 naming the first tensor that
failed. `--perturb-rank R` shifts rank R's shards of the actor before the step: a rank whose state
diverged, which the check must catch.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from atlas.checks.distributed import (
    ATOL,
    RTOL,
    build,
    checkpoint_tensors,
    digest,
    fixed_batch,
    full,
    load_full,
    step_grads,
)
from atlas.config.training import RoundtripSlice
from atlas.hashing import atomic_write_json
from atlas.model.policy import ROLES
from atlas.stage import log, run, stage_parser


def main(argv: list[str] | None = None) -> None:
    ap = stage_parser(__doc__.splitlines()[0])  # verifies --model and --run-folder
    ap.add_argument("--model", required=True, type=Path, help="the base model folder")
    ap.add_argument("--run-folder", required=True, type=Path, help="results/runs/<run>")
    ap.add_argument("--perturb-rank", type=int, default=None)
    args = ap.parse_args(argv)
    sl = RoundtripSlice.model_validate(args.config_slice)
    training = sl.training
    # NCCL needs a GPU per rank; with fewer GPUs than ranks the check runs on gloo over CPU
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", 1))
    dist.init_process_group("nccl" if cuda else "gloo")
    # the job's threads (OMP_NUM_THREADS, inherited by both ranks) shared between the ranks
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        # float32 matmuls in full precision on both sides of the comparison (no TF32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    tensors, step, path = checkpoint_tensors(args.run_folder)
    batch = fixed_batch(args.run_folder / "trajectories.parquet", rows=2 * world)
    ids, sampled, score = (t.to(device) for t in batch)
    total = float(sampled[:, 1:].sum())
    lr = {"actor": training.ppo.actor_lr, "critic": training.ppo.critic_lr}

    # The reference: one process, the whole batch, no sharding; then the same policy is sharded
    # (one copy of the model per rank: at a real shape two would not fit beside the other jobs).
    ac = build(args.model, training, sl.seed).to(device)
    load_full(ac, tensors)
    where = f"distributed_roundtrip rank {rank}"
    log(where, "policy built", backend=dist.get_backend(), device=device, tokens_per_row=ids.shape[1])
    # The centred score, plus a fixed +-1 per row so the actor term never vanishes (equal scores).
    adv = score - score.mean() + torch.tensor([(-1.0) ** i for i in range(len(score))], device=device)
    ref_grads = step_grads(ac, ids, sampled, score, adv, total, 1.0)
    ac.zero_grad(set_to_none=True)
    log(where, "single-process step done")

    # the mesh of the chosen device: fully_shard's default mesh takes the machine's accelerator,
    # a CUDA device per rank, which one GPU under gloo does not have
    mesh = init_device_mesh(device.type, (world,))
    # Gathered parameters stay until the step ends (reshard_after_forward=False): each backward
    # reuses its forward's all-gather, half the traffic, which over gloo is most of the check's time
    for layer in ac.peft.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(ac.peft, mesh=mesh, reshard_after_forward=False)
    fully_shard(ac.value_head, mesh=mesh, reshard_after_forward=False)
    load_full(ac, tensors)
    loaded = {n: full(p) for role in ROLES for n, p in ac.trainable(role).items()}
    mismatch = [n for n, t in loaded.items() if not torch.equal(t, tensors[n])]
    if rank == args.perturb_rank:
        with torch.no_grad():
            for p in ac.trainable("actor").values():
                p.to_local().add_(0.1)
    half = slice(rank * len(ids) // world, (rank + 1) * len(ids) // world)
    grads = step_grads(ac, ids[half], sampled[half], score[half], adv[half], total, float(world))
    log(where, "sharded step done")
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
    run(main)
