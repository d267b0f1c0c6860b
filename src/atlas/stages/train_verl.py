"""Training stage on verl (`training.engine: verl`): one run through verl's V1 synchronous PPO.

The `train` rule runs this module instead of atlas.stages.train when the engine is verl, with the
same arguments and the same output folder. It prepares the run (atlas.verl.launch: datasets,
agent loop settings, checked overrides), runs `python -m verl.trainer.main_ppo`, and converts
verl's outputs into the run folder a local run gets (atlas.verl.convert).

    python -m atlas.stages.train_verl --config-slice '<json>' --train results/data/train.parquet \\
        --val results/data/val.parquet --tests results/data/tests.parquet \\
        --model results/models/tiny --checkpoints results/checkpoints/zero_potential \\
        --out results/runs/zero_potential [--dry-run]

`--dry-run` writes everything up to the overrides (and checks them against verl's config) and
prints the command instead of running it.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from atlas.config.training import TrainSlice
from atlas.graders.sandbox import require_sandbox
from atlas.hashing import sha256_file
from atlas.rl import journal, recovery, runlock
from atlas.rl.journal import validation_points
from atlas.runtime.inputs import TrainingInputs
from atlas.stage import code_files, log, run, training_parser
from atlas.verl import convert
from atlas.verl.config import launch_command
from atlas.verl.launch import prepare

MODULE = "atlas.stages.train_verl"


def main(argv: list[str] | None = None) -> None:
    p = training_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="prepare and check (the checkpoint folder too: bad checkpoints and the episodes a "
        "resume writes again are moved aside), print the command, stop",
    )
    args = p.parse_args(argv)
    s = args.config_slice
    cfg = TrainSlice.model_validate(s)
    inputs = TrainingInputs(
        train=args.train, val=args.val, tests=args.tests, model=args.model, snapshot=args.snapshot
    )
    name = cfg.run.name
    require_sandbox(cfg.graders.allow_unsandboxed)  # verl's agent loop grades: bwrap missing stops here
    root = args.checkpoints
    runlock.guard(root, name)  # one writer per run folder, dying with its parent
    fingerprint = {"config": s, "inputs": {str(x): sha256_file(x) for x in inputs.files()}}
    journal.open_root(root, fingerprint, cfg.training.resume_mode, name)
    if cfg.training.resume_mode == "auto":  # verl resumes from its tracker: only good steps stay
        recovery.check_verl_checkpoints(root, root / "verl" / "checkpoints", name)
        done = recovery.verl_latest(root / "verl" / "checkpoints")
        if (aside := convert.retire_episodes(root / "episodes", done)) is not None:
            log(name, "episodes verl writes again moved aside", resumes_after=done, to=aside)
    overrides, metrics, episodes, expected = prepare(cfg, s, inputs, root)
    command = launch_command(overrides)
    if args.dry_run:
        print(shlex.join(command))
        return
    env = dict(os.environ)
    if cfg.training.verl.ray_address:
        env["RAY_ADDRESS"] = cfg.training.verl.ray_address
    log_path = metrics.with_name(metrics.name.replace("metrics_", "launch_").replace(".jsonl", ".log"))
    log(name, "launching verl", log=log_path, overrides=len(overrides))
    with open(log_path, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise SystemExit(f"verl exited with status {done.returncode}; last lines of {log_path}:\n{tail}")
    convert_run(
        cfg, s, inputs, root, args.out, episodes=episodes, metrics_dir=metrics.parent, expected=expected
    )


def convert_run(
    cfg: TrainSlice,
    s: dict,
    inputs: TrainingInputs,
    root,
    out,
    *,
    episodes,
    metrics_dir,
    expected: dict[str, int],
) -> None:
    """verl's outputs of the finished run (the agent loop's `episodes` folder, the launches'
    metrics_<n>.jsonl in `metrics_dir`, its checkpoints under root) into the journal, then into
    the run folder `out` a local run gets."""
    name, steps = cfg.run.name, cfg.run.steps
    points = validation_points(steps, cfg.training.validation_every)
    convert.write_journal(
        root,
        run=name,
        steps=steps,
        validated=points,
        records_dir=episodes,
        metrics_files=sorted(metrics_dir.glob("metrics_*.jsonl"), key=lambda p: int(p.stem.split("_")[1])),
        gamma=cfg.training.ppo.gamma,
        dose=cfg.run.dose,
        expected=expected,
    )
    convert.assemble_run(
        inputs, root, out, s, name=name, steps=steps, validated=points, module=MODULE, code=code_files
    )


if __name__ == "__main__":
    run(main)
