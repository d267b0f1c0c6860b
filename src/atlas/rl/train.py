"""Training stage: PPO with a LoRA actor and critic on the ordered schedule, for one run.

One run is the training smoke or an arm of the study (training.runs.<name> in the config). Each
step k takes the schedule's questions for step k and does DESIGN.md's training step:

    G episodes per question with the actor (grammar-constrained, real tools and graders)
    -> rewards from the records, + dose * (gamma * Phi(s') - Phi(s)) on each action token
    -> protocol check; records journaled                      (before any update uses them)
    -> old log-probs under replayed masks, reference, values, GAE; records get value/advantage
    -> critic update, actor update
    -> step metrics, call advantages; wandb; validation every k steps; compact checkpoint

With resume_mode auto a rerun continues after the latest complete checkpoint of the same config
and inputs (see atlas.rl.journal), and on CPU ends with the same bytes as an uninterrupted run.

    python -m atlas.rl.train --config-slice '{...}' --train results/data/train.parquet \
        --val results/data/val.parquet --tests results/data/tests.parquet \
        --model results/models/tiny [--snapshot results/runs/training_smoke] \
        --checkpoints results/checkpoints/zero_potential --out results/runs/zero_potential
"""

from __future__ import annotations

import json
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from atlas.config import GraderConfig, PPOConfig, ResourcesConfig, RunConfig, RuntimeConfig, TrainingConfig
from atlas.hashing import sha256_file
from atlas.model.policy import ActorCritic
from atlas.rl import journal, recovery, regrade, runlock, tracking
from atlas.rl.checkpoint import checkpoint_steps, export_adapters, load_compact, save_compact
from atlas.rl.potentials import Potential, make_potential
from atlas.rl.ppo import make_optimizers, make_schedulers, prepare, update
from atlas.rl.rollout import (
    StepRollout,
    call_advantages,
    check_protocol,
    collect,
    episode_specs,
    fill_records,
    rollout,
    step_questions,
    step_summary,
    validation_rows,
)
from atlas.rl.sampler import DeviceSampler
from atlas.rl.snapshot import CriticSnapshotPotential  # noqa: F401  (registers critic_snapshot)
from atlas.runtime.inputs import model_files, read_questions, read_tests, rollout_parser, smoke_slice
from atlas.runtime.session import Runtime, load_model, make_runtime
from atlas.stage import code_files, log, run

MODULE = "atlas.rl.train"


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


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    s = args.config_slice
    name, training = (
        s["training"]["run"]["name"],
        TrainingConfig.model_validate({k: v for k, v in s["training"].items() if k != "run"}),
    )
    root = args.checkpoints
    runlock.guard(root, name)  # one writer per run folder, dying with its parent

    # The working folder: same config and inputs -> keep (resume); else move the old work aside.
    fingerprint = {"config": s, "inputs": {p.as_posix(): sha256_file(p) for p in inputs_of(args)}}
    digest = journal.open_root(root, fingerprint, training.resume_mode, name)
    if training.resume_mode == "auto":  # bad checkpoints aside: resume from the last good one
        recovery.check_checkpoints(root, name)
    sess = open_session(s, args)
    steps = sess.steps

    points = validation_points(steps, training.validation_every)
    wandb_run = None

    def validate(done: int) -> None:
        t = time.perf_counter()
        specs = episode_specs(sess.val_questions, sess.tests, training.validation_samples)
        episodes = rollout(
            sess.rt, specs, sess.runtime, sess.graders, run=name, step=done, phase="val", seed=sess.seed
        )
        report = check_protocol(sess.rt, episodes, sess.runtime)
        rows = validation_rows(episodes, run=name, step=done)
        journal.write_validation(root, done, episodes, report, rows, run=name)
        by = {r["source"]: r for r in rows}
        log(
            name,
            "validation",
            steps_done=done,
            utility=round(by["all"]["utility"], 4),
            completed=by["all"]["completed_fraction"],
            violations=report.violations,
        )
        if wandb_run is not None:
            wandb_run.log(validation_log(rows) | {"timing_s/testing": time.perf_counter() - t}, step=done)

    # Resume (resume_mode auto) after re-grading the journal with today's graders (atlas.rl.regrade).
    start, plan, aside = 0, None, None
    if training.resume_mode == "auto" and (saved := checkpoint_steps(root)):
        questions = {q["question_uid"]: q for q in (*sess.train_rows, *sess.val_questions)}
        plan = regrade.plan_resume(
            root,
            saved[-1],
            saved,
            points,
            lambda folder: regrade.regrade_folder(folder, questions, sess.tests, sess.runtime, sess.graders),
        )
        aside = regrade.supersede(root, plan, saved, points)
        log(name, "re-graded the journal", **regrade.brief(plan), moved_aside=aside)
        for j in plan.revalidate:  # ascending: 0 runs on the fresh policy, before any load
            if j > 0:
                load_compact(root / f"step_{j}", sess.ac, sess.optimizers, sess.schedulers)
            validate(j)
        start = plan.start
        if start > 0:
            load_compact(root / f"step_{start}", sess.ac, sess.optimizers, sess.schedulers)
            log(name, "resuming", checkpoint=root / f"step_{start}", steps_done=start, of=steps)
    wandb_run = tracking.start(
        root,
        mode=training.wandb_mode,
        project=training.wandb_project,
        run_id=f"{name}-{digest[:12]}",  # one wandb run per run and fingerprint, across resumes
        name=name,
        config=s,
    )
    if aside is not None and wandb_run is not None:
        replay_journal(wandb_run, root, start, points)
    if start == 0:
        validate(0)
    bar = tqdm(total=steps, initial=start, desc=name, file=sys.stderr, mininterval=0, ascii=True)
    sampler = DeviceSampler().start()  # a daemon thread: it dies with the job on a crash
    for step in range(start, steps):
        t_step = time.perf_counter()

        def journal_rollouts(data, step=step):
            journal.write_step_rollouts(root, step, data.episodes, data.report, run=name)

        data, metrics = train_step(sess, step, journal_rollouts)
        done = step + 1
        if done in points:
            validate(done)
        if done in checkpoint_points(steps, training.checkpoint_every):
            t = time.perf_counter()
            save_compact(root, done, sess.ac, sess.optimizers, sess.schedulers, {"run": name, "steps": steps})
            metrics["timing_s/save_checkpoint"] = time.perf_counter() - t
        metrics["timing_s/step"] = time.perf_counter() - t_step
        metrics.update(peak_memory())
        journal.write_step_results(
            root,
            step,
            metrics,
            call_advantages(data.episodes, run=name, step=step, gamma=sess.ppo.gamma, dose=sess.run_cfg.dose),
            sampler.take(),
        )
        if wandb_run is not None:
            wandb_run.log(metrics, step=done)
        bar.update(1)
        bar.set_postfix(score=f"{metrics['critic/score/mean']:.3f}", pg=f"{metrics['actor/pg_loss']:.3f}")
        log(
            name,
            f"step {step} done",
            score=round(metrics["critic/score/mean"], 4),
            pg_loss=round(metrics["actor/pg_loss"], 5),
            seconds=round(metrics["timing_s/step"], 1),
        )
    bar.close()
    sampler.stop()
    if wandb_run is not None:
        wandb_run.finish()

    journal.assemble(
        args.out,
        root,
        run=name,
        steps=steps,
        validated=points,
        checkpoints=checkpoint_points(steps, training.checkpoint_every),
        run_info={
            "run": name,
            "steps": steps,
            "potential": sess.run_cfg.potential,
            "snapshot": getattr(sess.potential, "source", None),
            "snapshot_step": getattr(sess.potential, "step", None),
            "dose": sess.run_cfg.dose,
            "resumed_from_step": start,
            "regrade": None if plan is None else regrade.summary(plan),
            "superseded": None if aside is None else aside.as_posix(),
            "checkpoints": root.as_posix(),
        },
        export=lambda folder: export_adapters(sess.ac, folder),
        manifest={"stage": name, "inputs": inputs_of(args), "code": code_files(MODULE), "config": s},
    )
    log(name, "wrote", out=args.out)


if __name__ == "__main__":
    run(main)
