"""Smoke stage: base-model rollouts over a slice of the validation set, through the real runtime.

Writes `<out>/` with records.parquet (one ExecutionRecord per generation), trajectories.parquet
(token ids and masks per episode), protocol.json (episodes, completed, generations, records,
calls, violations) and MANIFEST.json. Protocol violations are counted, never a crash; the stage
fails after writing if any occurred or an episode did not complete, so the pipeline stops there.

    python -m atlas.stages.smoke --config-slice '{...}' --val results/data/val.parquet \
        --tests results/data/tests.parquet --model results/models/tiny --out results/runs/smoke
"""

from __future__ import annotations

import json
import sys

from atlas.config.smoke import SmokeSlice
from atlas.contracts.protocol import PINNED_COUNTS
from atlas.graders.sandbox import require_sandbox
from atlas.runtime.episode import EpisodeSpec, run_episodes
from atlas.runtime.inputs import RolloutInputs, read_questions, read_tests, smoke_slice
from atlas.runtime.protocol import check_episodes
from atlas.runtime.runfolder import write_rollout_stage
from atlas.runtime.session import load_runtime
from atlas.stage import code_files, log, rollout_parser, run

RUN = "smoke"
MODULE = "atlas.stages.smoke"


def main(argv: list[str] | None = None) -> None:
    args = rollout_parser(__doc__.splitlines()[0]).parse_args(argv)
    sl = SmokeSlice.model_validate(args.config_slice)
    inputs = RolloutInputs(val=args.val, tests=args.tests, model=args.model)
    runtime, graders, smoke, resources = sl.runtime, sl.graders, sl.smoke, sl.resources
    require_sandbox(graders.allow_unsandboxed)  # before any model loads: bwrap missing stops here

    questions = smoke_slice(read_questions(inputs.val), smoke.questions)
    tests = read_tests(inputs.tests)
    specs = [
        EpisodeSpec(q, tests.get(q["question_uid"], []), k) for q in questions for k in range(smoke.samples)
    ]
    rt = load_runtime(inputs.model, runtime, resources.device)
    log(RUN, "rolling out", episodes=len(specs), questions=len(questions))
    episodes = run_episodes(
        rt,
        specs,
        runtime,
        graders,
        run=RUN,
        step=0,
        phase="val",
        seed=sl.seed,
        progress=lambda m: log(RUN, m),
    )
    report = check_episodes(
        episodes,
        rt.decode,
        rt.call_open_id,
        rt.call_close_id,
        max_trajectory_tokens=runtime.max_trajectory_tokens,
    )
    counts = {k: getattr(report, k) for k in PINNED_COUNTS}
    log(RUN, "protocol", **counts)

    write_rollout_stage(
        args.out,
        episodes,
        report,
        run=RUN,
        inputs=inputs,
        config=args.config_slice,
        code=code_files(MODULE),
    )
    if report.violations or report.completed != report.episodes:
        print(json.dumps(report.to_json(), indent=1), file=sys.stderr)  # the log keeps it all
        raise SystemExit(
            f"smoke: {report.violations} protocol violations, {report.completed}/{report.episodes} completed"
        )


if __name__ == "__main__":
    run(main)
