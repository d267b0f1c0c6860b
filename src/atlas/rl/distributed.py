"""Data-parallel training: one training step on N ranks under torchrun, the same step as one process.

`resources.gpus: N` (NCCL, one GPU a rank) or `resources.ranks: N` on a CPU (gloo) runs the
training job as `torchrun --nproc-per-node N -m atlas.stages.train ...`. Each step:

    the step's episodes (questions x responses, in schedule order) are dealt round-robin:
        episode j is rolled out by rank j % N; its seed depends on (question, sample, turn) only,
        so the episodes are the ones one process generates
    -> episodes and protocol counts gathered to every rank, in global order (every rank sees the
        same violations and stops together)
    -> old log-probs, reference log-probs and values on each rank's own rows, gathered; GAE,
        whitening and the batch's statistics over the global batch, as one process computes them
    -> each record's credit (reward, potentials, value, advantage) gathered; rank 0 journals the
        records with them, once, before the update
    -> critic and actor updates through DDP over each role's trainable tensors: a mini-batch is
        the same global rows as on one process, each rank's micro-batches accumulate under
        no_sync and the last one syncs (one all-reduce per optimizer step). A micro-batch's loss
        is weighted by its share of the *global* mini-batch's tokens, times N because DDP
        averages, so the synced gradient is the one-process token-mean gradient.

The trainable tensors start equal (DDP broadcasts them from rank 0) and stay equal (every rank
steps AdamW on the same synced gradient). So rank 0 writes the shared files (journal,
checkpoints, the run folder) and each checkpoint carries every rank's RNG state.

The step itself is atlas.rl.step.ppo_step, the same function for one process and N ranks: it
takes a `Share` and a `DataParallel`. With N = 1 nothing here talks to other processes: `Ranks()`
and `Share` pass through, and `atlas.rl.ppo.update` runs with its one-process sync.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from atlas.config.resources import ResourcesConfig
from atlas.config.training import PPOConfig
from atlas.model.policy import ROLES, ActorCritic
from atlas.rl.ppo import Batch, OneProcess, Prepared, advantages_of, forward_passes, prepare
from atlas.runtime.protocol import ProtocolReport

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training job's ranks (rank 0 of 1: a plain process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0 writes the shared files and talks to wandb."""
        return self.rank == 0

    def device(self, device: str) -> str:
        """The rank's device: its own GPU on cuda."""
        return f"cuda:{self.local_rank}" if device == "cuda" and self.world > 1 else device

    def all_gather(self, value: T) -> list[T]:
        """Every rank's `value`, by rank (pickled: episodes, records, small tensors)."""
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` on every rank."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def start(resources: ResourcesConfig) -> Ranks:
    """Join the job's process group (torchrun's environment); check it has the configured size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != resources.world_size:
        raise SystemExit(
            f"resources ask for {resources.world_size} training ranks (gpus {resources.gpus}, ranks "
            f"{resources.ranks}) but the job runs {world}: launch it with torchrun --nproc-per-node "
            f"{resources.world_size}"
        )
    if world == 1:
        return Ranks()
    local = int(os.environ["LOCAL_RANK"])
    # The job's threads (OMP_NUM_THREADS, inherited by every rank) shared by the host's ranks.
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["LOCAL_WORLD_SIZE"])))
    if resources.device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if resources.device == "cuda" else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), local)


# What stop() keeps: referenced here, it is never freed (the stages end with os._exit).
_KEPT: list[Any] = []


def stop(ranks: Ranks, *keep: Any) -> None:
    """Leave the job's process group, and keep `keep` (what holds DDP's reducers) until the
    process ends. A stage ends with os._exit (atlas.stage.run), so what is kept is never freed:
    freeing a reducer frees gloo's process group, whose destructor joins gloo's worker thread
    while holding the GIL, and a worker still freeing the last collective's work waits for that
    GIL. A rank that freed its reducers as the stage returned hung there for good."""
    _KEPT.extend(keep)
    if ranks.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def merge_reports(reports: Sequence[ProtocolReport], order: Callable[[dict], int]) -> ProtocolReport:
    """One report over every rank's episodes: counts summed, violation rows in global order."""
    out = ProtocolReport()
    for r in reports:
        for name in ("episodes", "completed", "generations", "records", "calls", "violations"):
            setattr(out, name, getattr(out, name) + getattr(r, name))
        out.violation_rows.extend(r.violation_rows)
    out.violation_rows.sort(key=order)  # stable: a row's turn order stays
    return out


class Share:
    """One batch's episodes dealt over the ranks: global row j belongs to rank j % world."""

    def __init__(self, ranks: Ranks, total: int):
        self.ranks, self.total = ranks, total

    def rows_of(self, rank: int) -> list[int]:
        return list(range(rank, self.total, self.ranks.world))

    @property
    def rows(self) -> list[int]:
        return self.rows_of(self.ranks.rank)

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's items of a list in global order (the episode specs)."""
        if len(items) != self.total:
            raise ValueError(f"{len(items)} items for a share of {self.total} rows")
        return [items[j] for j in self.rows]

    def gather(self, items: Sequence[T]) -> list[T]:
        """Every rank's items (this rank's rows, in order) back in global order, on every rank."""
        if self.ranks.world == 1:
            return list(items)
        out: list[Any] = [None] * self.total
        for rank, part in enumerate(self.ranks.all_gather(list(items))):
            for j, item in zip(self.rows_of(rank), part, strict=True):
                out[j] = item
        return out

    def gather_episodes(self, episodes: list, report: ProtocolReport) -> tuple[list, ProtocolReport]:
        """The global episodes and one protocol report over them."""
        if self.ranks.world == 1:
            return episodes, report
        everything = self.gather(episodes)
        index = {(ep.question["question_uid"], ep.sample): j for j, ep in enumerate(everything)}
        reports = self.ranks.all_gather(report)
        return everything, merge_reports(reports, lambda row: index[(row["question_uid"], row["sample"])])

    def slowest(self, timings: dict[str, float]) -> dict[str, float]:
        """Each timing as the slowest rank's."""
        if self.ranks.world == 1:
            return dict(timings)
        every = self.ranks.all_gather(timings)
        return {k: max(t[k] for t in every) for k in timings}

    def prepare(self, ac: ActorCritic, batch: Batch, ppo: PPOConfig, temperature: float) -> Prepared:
        """This rank's rows of the step's Prepared: passes on the local rows, advantages and
        statistics over the gathered global batch."""
        if self.ranks.world == 1:
            return prepare(ac, batch, ppo, temperature)
        old_lp, raw_lp, ref_lp, values, metrics = forward_passes(ac, batch, ppo, temperature)
        local = torch.stack(
            [batch.rewards, batch.sampled, batch.rollout_logprobs, old_lp, raw_lp, ref_lp, values]
        )
        parts = self.ranks.all_gather(local.cpu())
        width = max(p.shape[-1] for p in parts)
        full = torch.zeros((local.shape[0], self.total, width), dtype=local.dtype)
        for rank, part in enumerate(parts):
            full[:, self.rows_of(rank), : part.shape[-1]] = part
        whole = advantages_of(*full.to(local.device).unbind(0), ppo, metrics)
        mine, width = self.rows, local.shape[-1]

        def cut(x: torch.Tensor) -> torch.Tensor:
            return x[mine, :width].contiguous()

        return Prepared(
            cut(whole.old_logprobs),
            cut(whole.ref_logprobs),
            cut(whole.values),
            cut(whole.rewards),
            cut(whole.advantages),
            cut(whole.returns),
            whole.metrics,
        )


class _Trainable(nn.Module):
    """One role's trainable tensors as a module's parameters (the same tensors, shared): what DDP
    syncs, and nothing of the frozen base. Its forward runs the loss function it is given, so
    DDP sees each micro-batch's forward."""

    def __init__(self, params: list[nn.Parameter]):
        super().__init__()
        self.tensors = nn.ParameterList(params)

    def forward(self, loss_fn: Callable[[], Any]) -> Any:
        return loss_fn()


class DataParallel:
    """DDP over each role's trainable tensors, built once per training job."""

    def __init__(self, ac: ActorCritic, ranks: Ranks):
        self.ranks = ranks
        self.ddp: dict[str, DistributedDataParallel] = {}
        for role in ROLES:
            with ac.role(role):  # DDP registers the tensors that require grad: the role's own
                params = [p for _, p in sorted(ac.trainable(role).items())]
                self.ddp[role] = DistributedDataParallel(_Trainable(params), broadcast_buffers=False)

    def step(self, share: Share, mini_batches: int) -> StepSync:
        return StepSync(self, share, mini_batches)


class StepSync(OneProcess):
    """ppo.update's view of the other ranks for one step (see OneProcess)."""

    def __init__(self, dp: DataParallel, share: Share, mini_batches: int):
        self.dp, self.share, self.world = dp, share, share.ranks.world
        mini = -(-share.total // mini_batches)
        self.cuts = [range(start, min(share.total, start + mini)) for start in range(0, share.total, mini)]
        for rank in range(self.world):
            for m, cut in enumerate(self.cuts):
                if not set(share.rows_of(rank)) & set(cut):
                    raise SystemExit(
                        f"mini-batch {m} (rows {cut.start}-{cut.stop - 1} of {share.total}) has no rows on "
                        f"rank {rank} of {self.world}: every optimizer step needs at least one row per "
                        f"rank; lower training.ppo.mini_batches ({mini_batches}) or raise the rows a step"
                    )

    def mini_batches(self, n: int, mini_batches: int) -> list[list[int]]:
        rows = self.share.rows
        if n != len(rows):
            raise ValueError(f"a local batch of {n} rows for a share of {len(rows)}")
        return [[i for i, j in enumerate(rows) if j in cut] for cut in self.cuts]

    def total(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @contextlib.contextmanager
    def micro_batch(self, role: str, last: bool):
        ddp = self.dp.ddp[role]
        with contextlib.nullcontext() if last else ddp.no_sync():
            yield ddp

    def sums(self, sums: dict[str, float]) -> dict[str, float]:
        keys = list(sums)  # the same order on every rank: the same code filled it
        x = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            x = x.cuda()
        dist.all_reduce(x)
        return dict(zip(keys, x.tolist(), strict=True))
