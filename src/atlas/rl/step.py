"""One PPO training step and what it needs: the session (policy, potential, optimizers, runtime,
data) built from a run's config slice and the files it reads.

`ppo_step(...)` is DESIGN.md's training step from finished episodes, written once:

    rewards from the records, + dose * (gamma * Phi(s') - Phi(s)) on each action token
    -> protocol check, trajectory tensors
    -> old log-probs under replayed masks, reference, values, GAE; each record's Credit
    -> records journaled, once                                (before any update uses them)
    -> critic update, actor update
    -> step metrics

`train_step(sess, k)` rolls out the schedule's questions for step k (G episodes per question
with the actor: grammar-constrained, real tools and graders) and runs `ppo_step` on them; the
dose step runs `ppo_step` on one rollout at several doses. The stage that loops over the steps
(wandb, validation, checkpoints, resume) is atlas.stages.train; the checks stage reruns steps
from checkpoints through the same function. With more than one rank (atlas.rl.distributed) each
rank rolls out its share of the step and the update is data-parallel.
"""

from __future__ import annotations

import json
import logging
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.config.training import PPOConfig, RunConfig, TrainingConfig, TrainSlice
from atlas.graders.sandbox import require_sandbox
from atlas.model.merged import MergedModel
from atlas.model.policy import ActorCritic
from atlas.rl import journal
from atlas.rl.distributed import DataParallel, Ranks, Share
from atlas.rl.metrics import rollout_throughput, step_summary
from atlas.rl.potentials import Potential, make_potential
from atlas.rl.ppo import make_batch, make_optimizers, make_schedulers, update
from atlas.rl.replay import ReplayedMasks, replay_masks
from atlas.rl.rollout import StepRollout, credits_of, rollout_timings, shape, step_questions
from atlas.rl.serving import build_policy, rollout_runtime
from atlas.rl.snapshot import CriticSnapshotPotential  # noqa: F401  (registers critic_snapshot)
from atlas.runtime.episode import Episode
from atlas.runtime.inputs import TrainingInputs, read_questions, read_tests, smoke_slice
from atlas.runtime.rollouts import check_protocol, episode_specs, rollout
from atlas.runtime.session import Runtime

logger = logging.getLogger(__name__)


def build_potential(cfg: RunConfig, ac: ActorCritic, snapshot: Path | None):
    """The run's Phi. Factories receive the trainer's context and take what they need."""
    if cfg.potential == "critic_snapshot" and snapshot is None:
        raise SystemExit(f"potential critic_snapshot needs --snapshot (the run folder of {cfg.snapshot_of})")
    return make_potential(cfg.potential, model=ac, run_folder=snapshot, step=cfg.snapshot_step)


def peak_memory() -> dict[str, float]:
    out = {"perf/cpu_memory_used_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def validation_log(rows: list[dict]) -> dict[str, float]:
    return {
        f"val/{r['source']}/{k}": r[k] for r in rows for k in ("utility", "accuracy", "completed_fraction")
    }


def replay_journal(wandb_run, root: Path, start: int, points: list[int]) -> None:
    """Log the kept journal (validation points and step metrics up to `start`) into a new wandb
    log, in step order; wandb drops a step lower than one already logged."""
    for done in range(start + 1):
        if done in points and (folder := journal.val_dir(root, done)).is_dir():
            wandb_run.log(validation_log(json.loads((folder / "validation.json").read_text())), step=done)
        if done > 0:
            metrics = json.loads((journal.step_dir(root, done - 1) / "metrics.json").read_text())
            wandb_run.log(metrics, step=done)


@dataclass
class Session:
    """Everything one run's steps need, built from its config slice and inputs."""

    name: str
    steps: int
    seed: int
    runtime: RuntimeConfig
    graders: GraderConfig
    training: TrainingConfig
    run_cfg: RunConfig
    ac: ActorCritic
    rt: Runtime
    potential: Potential
    optimizers: dict
    schedulers: dict
    train_rows: list[dict]
    val_questions: list[dict]
    tests: dict
    ranks: Ranks
    dp: DataParallel | None  # DDP over the trainable tensors, with more than one rank
    merged: MergedModel | None = None

    @property
    def ppo(self) -> PPOConfig:
        return self.training.ppo

    def prepare_rollouts(self, questions_per_step: int) -> None:
        """Pay the engine's one-time costs of a step's rollout (its pool at the budget, every
        bucket's capture, the compiles) now, not on a step's clock: for a session that will roll
        out. A session that only loads and scores (the checks' fresh policies) leaves it out, so
        that several sessions of one process hold no pool each."""
        rows = -(-questions_per_step * self.training.responses_per_question // self.ranks.world)
        self.rt.engine.prepare(rows)

    def sync_rollout_model(self) -> None:
        """Fold the actor's current LoRA into the serving copy (after an update or a load)."""
        if self.merged is not None:
            self.merged.refresh()


def open_session(sl: TrainSlice, inputs: TrainingInputs, ranks: Ranks | None = None) -> Session:
    """The policy (fresh, seeded), its potential, optimizers and runtime, and the run's data."""
    runtime, graders, training, seed = sl.runtime, sl.graders, sl.training, sl.seed
    require_sandbox(graders.allow_unsandboxed)  # before any model loads: bwrap missing stops here
    random.seed(seed)  # every RNG a checkpoint saves starts from the config's seed
    torch.manual_seed(seed)
    val_rows = read_questions(inputs.val)
    ranks = ranks or Ranks()
    ac, tokenizer = build_policy(inputs.model, training, seed, ranks.device(sl.resources.device))
    potential = build_potential(sl.run, ac, inputs.snapshot)
    optimizers = make_optimizers(ac, training.ppo)
    rt, merged = rollout_runtime(ac, tokenizer, training, runtime, sl.resources.device)
    return Session(
        name=sl.run.name,
        steps=sl.run.steps,
        seed=seed,
        runtime=runtime,
        graders=graders,
        training=training,
        run_cfg=sl.run,
        ac=ac,
        rt=rt,
        potential=potential,
        optimizers=optimizers,
        schedulers=make_schedulers(optimizers, training.ppo, sl.run.steps),
        train_rows=read_questions(inputs.train),
        val_questions=smoke_slice(val_rows, training.validation_questions or len(val_rows)),
        tests=read_tests(inputs.tests),
        ranks=ranks,
        dp=DataParallel(ac, ranks) if ranks.world > 1 else None,
        merged=merged,
    )


def ppo_step(
    rt: Runtime,
    ac: ActorCritic,
    episodes: list[Episode],
    potential: Potential,
    ppo: PPOConfig,
    runtime: RuntimeConfig,
    optimizers: dict,
    *,
    dose: float,
    schedulers: dict | None = None,
    share: Share | None = None,
    dp: DataParallel | None = None,
    phis: list[list[float]] | None = None,
    masks: list[ReplayedMasks] | None = None,
    timings: dict[str, float] | None = None,
    journal_rollouts: Callable[[StepRollout], None] | None = None,
    where: str = "step",
) -> tuple[StepRollout, dict[str, float]]:
    """One PPO step on this rank's finished `episodes` (`share`: this rank's rows of the global
    batch; none: one process). Returns the global batch's StepRollout and the step's metrics.

    `journal_rollouts(data)` gets the records of the global batch with their credits exactly once,
    before the update uses them; a batch with protocol violations is journaled without values and
    advantages, and the step stops there. `phis` and `masks`: the potential's values and the
    replayed grammar masks per episode, when already computed (the dose step's, shared by its
    doses); when the step evaluates the potential itself its seconds are timing_s/potential.
    `timings`: the rollout's, reported with the step's as the slowest rank's."""
    share = share or Share(Ranks(), len(episodes))
    t = time.perf_counter()
    placed = shape(episodes, potential, gamma=ppo.gamma, dose=dose, phis=phis)
    timings = dict(timings or {})
    if phis is None:
        timings["timing_s/potential"] = time.perf_counter() - t
    report = check_protocol(rt, episodes, runtime, placed)
    if masks is None:
        masks = [replay_masks(ep, rt) for ep in episodes]
    device = next(rt.model.parameters()).device
    batch = make_batch(episodes, [p.token_rewards for p in placed], masks, rt.tokenizer.pad_token_id, device)
    everyone, report = share.gather_episodes(episodes, report)
    if report.violations:
        if journal_rollouts is not None:
            journal_rollouts(StepRollout(everyone, share.gather(credits_of(episodes, placed)), report))
        raise SystemExit(f"{where}: {report.violations} protocol violations")
    prep = share.prepare(ac, batch, ppo, runtime.temperature)
    data = StepRollout(everyone, share.gather(credits_of(episodes, placed, prep)), report)
    if journal_rollouts is not None:
        journal_rollouts(data)
    metrics = {**share.slowest(timings), **prep.metrics}
    sync = dp.step(share, ppo.mini_batches) if dp is not None else None
    metrics.update(update(ac, batch, prep, optimizers, schedulers, ppo, runtime.temperature, sync))
    metrics.update(step_summary(data.episodes, data.report))
    return data, metrics


def train_step(sess: Session, step: int, journal_rollouts=None) -> tuple[StepRollout, dict[str, float]]:
    """One PPO step on the schedule's step `step`: this rank's share of the step's episodes
    rolled out, then `ppo_step`. `journal_rollouts(data)` is called once, with the records and
    their credits, before the update."""
    specs = episode_specs(
        step_questions(sess.train_rows, step), sess.tests, sess.training.responses_per_question
    )
    sess.sync_rollout_model()
    share = Share(sess.ranks, len(specs))  # each rank rolls out its share; the step gathers them
    t = time.perf_counter()
    episodes = rollout(
        sess.rt,
        share.mine(specs),
        sess.runtime,
        sess.graders,
        run=sess.name,
        step=step,
        phase="train",
        seed=sess.seed,
        progress=lambda m: logger.info("%s: step %d: %s", sess.name, step, m),
    )
    data, metrics = ppo_step(
        sess.rt,
        sess.ac,
        episodes,
        sess.potential,
        sess.ppo,
        sess.runtime,
        sess.optimizers,
        dose=sess.run_cfg.dose,
        schedulers=sess.schedulers,
        share=share,
        dp=sess.dp,
        timings=rollout_timings(episodes, time.perf_counter() - t),
        journal_rollouts=journal_rollouts,
        where=f"{sess.name} step {step}",
    )
    metrics.update(rollout_throughput(data.episodes, metrics["timing_s/gen"]))
    metrics["training/global_step"] = float(step + 1)
    return data, metrics
