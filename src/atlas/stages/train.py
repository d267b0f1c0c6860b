"""Training stage: PPO with a LoRA actor and critic on the ordered schedule, for one run.

One run is the training smoke or an arm of the study (runs.<name> in the config). Each
step is atlas.rl.step.train_step; around it this stage journals the records once, before the update,
validates every k steps, saves compact checkpoints, logs to wandb and assembles the run folder.

With resume_mode auto a rerun continues after the latest complete checkpoint of the same config
and inputs (see atlas.rl.journal), and on CPU ends with the same bytes as an uninterrupted run.
With resources.gpus (or resources.ranks on a CPU) N > 1 the rule starts N data-parallel ranks
under torchrun (atlas.rl.distributed); rank 0 writes the journal, checkpoints and run folder.

    python -m atlas.stages.train --config-slice '{...}' --train results/data/train.parquet \
        --val results/data/val.parquet --tests results/data/tests.parquet \
        --model results/models/tiny [--snapshot results/runs/training_smoke] \
        --checkpoints results/checkpoints/zero_potential --out results/runs/zero_potential
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

from atlas.config.training import TrainSlice
from atlas.hashing import sha256_file
from atlas.rl import journal, recovery, runlock, tracking
from atlas.rl.journal import checkpoint_points, validation_points
from atlas.runtime.inputs import TrainingInputs
from atlas.stage import code_files, log, run, training_parser

MODULE = "atlas.stages.train"


def main(argv: list[str] | None = None) -> None:
    args = training_parser(__doc__.splitlines()[0]).parse_args(argv)  # inputs checked against their manifests
    s = args.config_slice
    sl = TrainSlice.model_validate(s)
    inputs = TrainingInputs(
        train=args.train, val=args.val, tests=args.tests, model=args.model, snapshot=args.snapshot
    )
    name, training = sl.run.name, sl.training
    root = args.checkpoints
    # the one process, or rank 0 of torchrun's (atlas.rl.distributed.start reads the same variables)
    lead = int(os.environ.get("WORLD_SIZE", "1")) == 1 or int(os.environ["RANK"]) == 0
    if lead:  # every rank already dies with torchrun and its starter (atlas.stages, atlas.lifetime)
        runlock.guard(root, name)  # one writer per run folder, dying with its parent

    # The working folder: same config and inputs -> keep (resume); else move the old work aside.
    fingerprint = {"config": s, "inputs": {p.as_posix(): sha256_file(p) for p in inputs.files()}}
    digest = journal.open_root(root, fingerprint, training.resume_mode, name) if lead else ""
    if lead and training.resume_mode == "auto":  # bad checkpoints aside: resume from the last good one
        recovery.check_checkpoints(root, name)

    if lead:  # wandb's modules before torch's: its init imports them faster (tracking.preload)
        tracking.preload(training.wandb_mode)
    # torch, transformers and peft load only now (about 5 s of CPU): a refused input, a second
    # writer or a corrupt checkpoint is named before that.
    from atlas.rl import distributed, regrade
    from atlas.rl.checkpoint import checkpoint_steps, export_adapters, load_compact, rng_state, save_compact
    from atlas.rl.distributed import Share
    from atlas.rl.metrics import call_advantages
    from atlas.rl.sampler import DeviceSampler
    from atlas.rl.step import open_session, peak_memory, replay_journal, train_step, validation_log
    from atlas.runtime.rollouts import check_protocol, episode_specs, rollout, validation_rows

    ranks = distributed.start(sl.resources)
    assert ranks.main == lead, (ranks.rank, os.environ.get("RANK"))
    ranks.barrier()
    sess = open_session(sl, inputs, ranks)
    sess.prepare_rollouts(sl.schedule.questions_per_step)
    steps = sess.steps

    def load(k: int) -> None:  # every rank loads the shared tensors and its own RNG state
        load_compact(root / f"step_{k}", sess.ac, sess.optimizers, sess.schedulers, ranks.rank, ranks.world)

    points = validation_points(steps, training.validation_every)
    wandb_run = None

    def validate(done: int) -> None:
        t = time.perf_counter()
        specs = episode_specs(sess.val_questions, sess.tests, training.validation_samples)
        sess.sync_rollout_model()
        share = Share(ranks, len(specs))  # each rank validates its share; rank 0 journals all
        episodes = rollout(
            sess.rt,
            share.mine(specs),
            sess.runtime,
            sess.graders,
            run=name,
            step=done,
            phase="val",
            seed=sess.seed,
        )
        episodes, report = share.gather_episodes(episodes, check_protocol(sess.rt, episodes, sess.runtime))
        rows = validation_rows(episodes, run=name, step=done)
        if ranks.main:
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

    # Resume (resume_mode auto) after re-grading the journal with the current graders (atlas.rl.regrade).
    start, plan, aside = 0, None, None
    if training.resume_mode == "auto" and (saved := checkpoint_steps(root)):
        if ranks.main:  # rank 0 re-grades and moves superseded work aside; every rank follows
            questions = {q["question_uid"]: q for q in (*sess.train_rows, *sess.val_questions)}
            plan = regrade.plan_resume(
                root,
                saved[-1],
                saved,
                points,
                lambda folder: regrade.regrade_folder(
                    folder, questions, sess.tests, sess.runtime, sess.graders
                ),
            )
            aside = regrade.supersede(root, plan, saved, points)
            log(name, "re-graded the journal", **regrade.brief(plan), moved_aside=aside)
        plan, aside = ranks.broadcast((plan, aside))
        for j in plan.revalidate:  # ascending: 0 runs on the fresh policy, before any load
            if j > 0:
                load(j)
            validate(j)
        start = plan.start
        if start > 0:
            load(start)
            log(name, "resuming", checkpoint=root / f"step_{start}", steps_done=start, of=steps)
    if ranks.main and (earlier := tracking.retire(root)) is not None:
        log(name, "an earlier attempt's wandb log moved aside; the journal is replayed", to=earlier)
    wandb_run = (
        None
        if not ranks.main
        else tracking.start(
            root,
            mode=training.wandb_mode,
            project=training.wandb_project,
            run_id=f"{name}-{digest[:12]}",  # one wandb run per run and fingerprint, across resumes
            name=name,
            config=s,
        )
    )
    if start > 0 and wandb_run is not None:  # a new log: the steps before `start` from the journal
        replay_journal(wandb_run, root, start, points)
    if start == 0:
        validate(0)
    bar = tqdm(
        total=steps,
        initial=start,
        desc=name,
        file=sys.stderr,
        mininterval=0,
        ascii=True,
        disable=not ranks.main,
    )
    sampler = DeviceSampler()
    if ranks.main:
        sampler.start()  # a daemon thread: it dies with the job on a crash
    for step in range(start, steps):
        t_step = time.perf_counter()

        def journal_rollouts(data, step=step):
            if ranks.main:
                journal.write_step_rollouts(root, step, data.episodes, data.credits, data.report, run=name)

        data, metrics = train_step(sess, step, journal_rollouts)
        done = step + 1
        if done in points:
            validate(done)
        metrics["timing_s/step"] = time.perf_counter() - t_step
        metrics.update(peak_memory())
        if ranks.main:  # the step's journal is whole before its checkpoint exists: a resume needs it
            calls = call_advantages(
                data.episodes, data.credits, run=name, step=step, gamma=sess.ppo.gamma, dose=sess.run_cfg.dose
            )
            journal.write_step_results(root, step, metrics, calls, sampler.take())
        if done in checkpoint_points(steps, training.checkpoint_every):
            t = time.perf_counter()
            rngs = ranks.all_gather(rng_state())  # each rank's generators; rank 0 writes
            if ranks.main:
                extra = {"run": name, "steps": steps}
                save_compact(root, done, sess.ac, sess.optimizers, sess.schedulers, extra, rngs)
            ranks.barrier()
            metrics["timing_s/save_checkpoint"] = time.perf_counter() - t
            metrics["timing_s/step"] = time.perf_counter() - t_step
            if ranks.main:  # killed before this line, the step keeps its metrics without the save's
                journal.write_step_metrics(root, step, metrics)
        if not ranks.main:
            continue
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
    if not ranks.main:
        distributed.stop(ranks, sess)  # the session holds the DDP reducers: never freed
        return
    sampler.stop()
    if wandb_run is not None:
        wandb_run.finish()
        tracking.teardown()

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
        manifest={"stage": name, "inputs": inputs.files(), "code": code_files(MODULE), "config": s},
    )
    log(name, "wrote", out=args.out)
    distributed.stop(ranks, sess)


if __name__ == "__main__":
    run(main)
