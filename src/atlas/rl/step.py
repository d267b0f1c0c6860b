"""One PPO training step and what it needs: the session (policy, potential, optimizers, runtime,
data) built from a run's config slice, and the command line the training-shaped stages share.

`train_step(sess, k)` takes the schedule's questions for step k and does DESIGN.md's training step:

    G episodes per question with the actor (grammar-constrained, real tools and graders)
    -> rewards from the records, + dose * (gamma * Phi(s') - Phi(s)) on each action token
    -> protocol check; records journaled                      (before any update uses them)
    -> old log-probs under replayed masks, reference, values, GAE; records get value/advantage
    -> critic update, actor update
    -> step metrics, call advantages

The stage that loops over the steps (wandb, validation, checkpoints, resume) is atlas.stages.train;
the checks stage reruns steps from checkpoints through the same function.
"""

from __future__ import annotations

import json
import random
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

from atlas.config import GraderConfig, PPOConfig, ResourcesConfig, RunConfig, RuntimeConfig, TrainingConfig
from atlas.model.policy import ActorCritic
from atlas.rl import journal
from atlas.rl.potentials import Potential, make_potential
from atlas.rl.ppo import make_optimizers, make_schedulers, prepare, update
from atlas.rl.rollout import (
    StepRollout,
    collect,
    episode_specs,
    fill_records,
    step_questions,
    step_summary,
)
from atlas.rl.snapshot import CriticSnapshotPotential  # noqa: F401  (registers critic_snapshot)
from atlas.runtime.inputs import model_files, read_questions, read_tests, rollout_parser, smoke_slice
from atlas.runtime.session import Runtime, load_model, make_runtime
from atlas.stage import log


def parser(description: str):
    p = rollout_parser(description)
    p.add_argument("--train", required=True, type=Path, help="results/data/train.parquet")
    p.add_argument("--checkpoints", required=True, type=Path, help="results/checkpoints/<run>")
    p.add_argument("--snapshot", type=Path, help="run folder whose critic is the frozen potential")
    return p


def inputs_of(args) -> list[Path]:
    snapshot = [args.snapshot / "checkpoints.json"] if args.snapshot else []
    return [args.train, args.val, args.tests, *model_files(args.model), *snapshot]


def build_policy(model_dir: Path, training: TrainingConfig, seed: int, device: str):
    """The actor-critic on the base model, with gradient checkpointing when the config asks for it
    (it acts in the updates only: transformers recomputes layers in training mode)."""
    base, tokenizer = load_model(model_dir, device)
    ac = ActorCritic(base, training, seed=seed).to(device)
    if training.ppo.on_gpu("gradient_checkpointing", torch.device(device).type == "cuda"):
        ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return ac, tokenizer


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


def validation_points(steps: int, every: int) -> list[int]:
    """Steps done at which the policy is validated: before training, every k, and at the end."""
    return sorted({0, steps, *range(every, steps + 1, every)})


def checkpoint_points(steps: int, every: int) -> list[int]:
    return sorted({steps, *range(every, steps + 1, every)})


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

    @property
    def ppo(self) -> PPOConfig:
        return self.training.ppo


def open_session(s: dict, args) -> Session:
    """The policy (fresh, seeded), its potential, optimizers and runtime, and the run's data."""
    runtime, graders = RuntimeConfig.model_validate(s["runtime"]), GraderConfig.model_validate(s["graders"])
    resources = ResourcesConfig.model_validate(s["resources"])
    run = s["training"]["run"]
    run_cfg = RunConfig.model_validate({k: v for k, v in run.items() if k != "name"})
    training = TrainingConfig.model_validate({k: v for k, v in s["training"].items() if k != "run"})
    seed = s["seed"]
    random.seed(seed)  # every RNG a checkpoint saves starts from the config's seed
    torch.manual_seed(seed)
    val_rows = read_questions(args.val)
    ac, tokenizer = build_policy(args.model, training, seed, resources.device)
    potential = build_potential(run_cfg, ac, args.snapshot)
    optimizers = make_optimizers(ac, training.ppo)
    return Session(
        name=run["name"],
        steps=run["steps"],
        seed=seed,
        runtime=runtime,
        graders=graders,
        training=training,
        run_cfg=run_cfg,
        ac=ac,
        rt=make_runtime(ac.peft, tokenizer, runtime),
        potential=potential,
        optimizers=optimizers,
        schedulers=make_schedulers(optimizers, training.ppo, run["steps"]),
        train_rows=read_questions(args.train),
        val_questions=smoke_slice(val_rows, training.validation_questions or len(val_rows)),
        tests=read_tests(args.tests),
    )


def train_step(sess: Session, step: int, journal_rollouts=None) -> tuple[StepRollout, dict[str, float]]:
    """One PPO step on the schedule's step `step`. `journal_rollouts(data)` is called with the
    records before the update, twice: as rolled out and shaped, then with values and advantages."""
    specs = episode_specs(
        step_questions(sess.train_rows, step), sess.tests, sess.training.responses_per_question
    )
    data = collect(
        sess.rt,
        specs,
        sess.runtime,
        sess.graders,
        sess.potential,
        gamma=sess.ppo.gamma,
        dose=sess.run_cfg.dose,
        run=sess.name,
        step=step,
        seed=sess.seed,
        progress=lambda m: log(sess.name, f"step {step}: {m}"),
    )
    if journal_rollouts is not None:
        journal_rollouts(data)
    if data.report.violations:
        raise SystemExit(f"{sess.name} step {step}: {data.report.violations} protocol violations")
    prep = prepare(sess.ac, data.batch, sess.ppo, sess.runtime.temperature)
    fill_records(data.episodes, prep)
    if journal_rollouts is not None:
        journal_rollouts(data)
    metrics = {**data.timings, **prep.metrics}
    metrics.update(
        update(
            sess.ac, data.batch, prep, sess.optimizers, sess.schedulers, sess.ppo, sess.runtime.temperature
        )
    )
    metrics.update(step_summary(data.episodes, data.report))
    metrics["training/global_step"] = float(step + 1)
    return data, metrics
