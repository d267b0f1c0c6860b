"""Dose step: one PPO step from the same start at several shaping doses, on identical rollouts.

The rollouts of schedule step 0 are made once, with the initial policy, sampled as the trainer
samples (atlas.rl.serving.rollout_runtime: the merged serving copy on a GPU). For each dose d the
policy and optimizers are reset to that start and the trainer's step (atlas.rl.step.ppo_step)
runs on those rollouts with dose d * (gamma * Phi(s') - Phi(s)) (Phi: the frozen critic snapshot
by default). The records stay as the runtime wrote them; each dose gives them its own credits.
Because the shaping telescopes, every episode's shaped return (sum_k gamma^k reward_k over its
records) must differ from its dose-0 return by exactly -d * Phi(s_0); dose_step.json holds that
check per dose and episode, and the change of the call advantage (by turn and tool) per dose.
records.parquet holds each dose's rows under the run name dose_step/dose=<d>.

    python -m atlas.stages.dose_step --config-slice '{...}' --train results/data/train.parquet \
        --val results/data/val.parquet --tests results/data/tests.parquet \
        --model results/models/tiny --snapshot results/runs/training_smoke --out results/runs/dose_step
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from atlas.config.training import DoseSlice, RunConfig
from atlas.contracts import runs
from atlas.contracts.records import TRAJECTORY_SCHEMA
from atlas.graders.sandbox import require_sandbox
from atlas.hashing import atomic_dir, atomic_write_json, write_manifest
from atlas.model.policy import ROLES
from atlas.rl.metrics import call_advantages
from atlas.rl.potentials import evaluate_potentials
from atlas.rl.ppo import make_optimizers
from atlas.rl.replay import replay_masks
from atlas.rl.rollout import step_questions
from atlas.rl.serving import build_policy, rollout_runtime
from atlas.rl.step import build_potential, ppo_step
from atlas.runtime.inputs import TrainingInputs, read_questions, read_tests
from atlas.runtime.records import write_records
from atlas.runtime.rollouts import episode_specs, rollout
from atlas.runtime.runfolder import trajectory_row
from atlas.stage import code_files, log, rollout_parser, run

RUN = "dose_step"
MODULE = "atlas.stages.dose_step"
TOLERANCE = 1e-9  # float64 sums of a handful of terms: only rounding separates the two sides


def shaped_return(credits, gamma: float) -> float:
    """sum_k gamma^k reward_k over an episode's records (their credits, in order)."""
    return sum(gamma**k * c.reward for k, c in enumerate(credits))


def main(argv: list[str] | None = None) -> None:
    p = rollout_parser(__doc__.splitlines()[0])
    p.add_argument("--train", required=True, type=Path, help="results/data/train.parquet")
    p.add_argument("--snapshot", type=Path, help="run folder whose critic is the frozen potential")
    args = p.parse_args(argv)
    s = args.config_slice
    sl = DoseSlice.model_validate(s)
    inputs = TrainingInputs(
        train=args.train, val=args.val, tests=args.tests, model=args.model, snapshot=args.snapshot
    )
    runtime, graders, resources, training, dose_cfg = (
        sl.runtime,
        sl.graders,
        sl.resources,
        sl.training,
        sl.run,
    )
    require_sandbox(graders.allow_unsandboxed)  # before any model loads: bwrap missing stops here
    ppo, seed = training.ppo, sl.seed
    run_cfg = RunConfig(
        potential=dose_cfg.potential, snapshot_of=dose_cfg.snapshot_of, snapshot_step=dose_cfg.snapshot_step
    )

    ac, tokenizer = build_policy(inputs.model, training, seed, resources.device)
    potential = build_potential(run_cfg, ac, inputs.snapshot)
    rt, _ = rollout_runtime(ac, tokenizer, training, runtime, resources.device)  # as the trainer samples
    start = {role: {n: t.detach().clone() for n, t in ac.trainable(role).items()} for role in ROLES}

    questions = step_questions(read_questions(inputs.train), 0)
    specs = episode_specs(questions, read_tests(inputs.tests), training.responses_per_question)
    log(RUN, "rolling out once", episodes=len(specs))
    episodes = rollout(rt, specs, runtime, graders, run=RUN, step=0, phase="train", seed=seed)
    masks = [replay_masks(ep, rt) for ep in episodes]
    phis = evaluate_potentials(potential, episodes)  # the frozen Phi: the same at every dose

    per_dose, records, credits, calls, metrics_rows = [], [], [], [], []
    base_returns: list[float] | None = None
    for dose in dose_cfg.doses:
        with torch.no_grad():  # the same start for every dose
            for role in ROLES:
                for n, t in ac.trainable(role).items():
                    t.copy_(start[role][n])
        data, metrics = ppo_step(
            rt,
            ac,
            episodes,
            potential,
            ppo,
            runtime,
            make_optimizers(ac, ppo),
            dose=dose,
            phis=phis,
            masks=masks,
            where=f"{RUN} dose {dose}",
        )
        report = data.report

        returns = [shaped_return(c, ppo.gamma) for c in data.credits]
        phi0 = [c[0].potential_before for c in data.credits]
        base_returns = returns if base_returns is None else base_returns
        residuals = [r - b + dose * f for r, b, f in zip(returns, base_returns, phi0, strict=True)]
        worst = max(abs(x) for x in residuals)
        log(RUN, f"dose {dose}", violations=report.violations, telescoping_residual=worst)
        if report.violations or worst > TOLERANCE:
            raise SystemExit(f"dose {dose}: {report.violations} violations, telescoping residual {worst}")
        name = f"{RUN}/dose={dose}"
        records.extend(replace(r, run=name) for ep in data.episodes for r in ep.records)
        credits.extend(c for mine in data.credits for c in mine)
        dose_calls = call_advantages(data.episodes, data.credits, run=RUN, step=0, gamma=ppo.gamma, dose=dose)
        calls.extend(dose_calls)
        metrics_rows.append({"run": RUN, "step": 0, "dose": dose, **metrics})
        per_dose.append(
            {
                "dose": dose,
                "protocol": {k: v for k, v in report.to_json().items() if k != "violation_rows"},
                "episodes": [
                    {
                        "question_uid": ep.question["question_uid"],
                        "sample": ep.sample,
                        "phi_s0": f,
                        "shaped_return": r,
                        "return_at_dose_0": b,
                        "residual": x,
                    }
                    for ep, f, r, b, x in zip(
                        data.episodes, phi0, returns, base_returns, residuals, strict=True
                    )
                ],
                "max_abs_residual": worst,
                "call_advantage": dose_calls,
            }
        )

    zero = {(c["turn"], c["tool"]): c["advantage_mean"] for c in per_dose[0]["call_advantage"]}
    for d in per_dose:
        for c in d["call_advantage"]:
            c["advantage_mean_change"] = c["advantage_mean"] - zero[(c["turn"], c["tool"])]

    with atomic_dir(args.out) as tmp:
        write_records(tmp / "records.parquet", records, credits)
        rows = [trajectory_row(ep, run=RUN, step=0, phase="train") for ep in episodes]
        pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), tmp / "trajectories.parquet")
        runs.table(calls, runs.DOSE_CALL_ADVANTAGES_SCHEMA, "dose step call advantages").write_parquet(
            tmp / "call_advantages.parquet"
        )
        runs.table(metrics_rows, runs.DOSE_STEP_METRICS_SCHEMA, "dose step metrics").write_parquet(
            tmp / "step_metrics.parquet"
        )
        total = per_dose[0]["protocol"]
        atomic_write_json(tmp / "protocol.json", {"run": RUN, **total})
        atomic_write_json(
            tmp / "dose_step.json",
            {
                "potential": run_cfg.potential,
                "snapshot": getattr(potential, "source", None),
                "gamma": ppo.gamma,
                "tolerance": TOLERANCE,
                "doses": per_dose,
            },
        )
        write_manifest(tmp, stage=RUN, inputs=inputs.files(), code=code_files(MODULE), config=s)
    log(RUN, "wrote", out=args.out)


if __name__ == "__main__":
    run(main)
