"""Grading throughput: atlas's grade_many against lcb_runner's own evaluation, side by side.

    python scripts/bench_graders.py /path/to/LiveCodeBench [--programs 40] [--rounds 3] [--workers 2]

Grades the same correct programs (the fixtures' reference solutions, each on all of its tests)
through `atlas.graders.lcb.grade_many` with `--workers` workers and through LiveCodeBench's
`lcb_runner.evaluation.compute_code_generation_metrics.evaluate_generations` with as many
processes (`num_process_evaluate`: its evaluation grades programs in parallel, each through
`check_correctness`), alternating rounds in one run. Prints programs/s and tests/s of each, their
ratio, and whether every verdict agrees. lcb_runner is not a dependency: pass the path of a
checkout of its public repository (it needs numpy and tqdm beside it).
Where one program's time goes: scripts/bench_sandbox.py.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from atlas.config.graders import GraderConfig
from atlas.data.lcb import read_lcb
from atlas.graders.lcb import grade_many
from atlas.graders.sandbox import isolation_available

FIXTURES = Path(__file__).resolve().parent.parent / "resources" / "fixtures"


def programs(count: int) -> list[tuple[str, list, str | None]]:
    """(code, tests, func_name) of `count` correct programs, cycling through the fixtures."""
    questions = read_lcb(FIXTURES / "lcb_train.jsonl", "train") + read_lcb(FIXTURES / "lcb_val.jsonl", "val")
    solutions = json.loads((FIXTURES / "lcb_solutions.json").read_text(encoding="utf-8"))
    jobs = [(solutions[q.record_id], q.public_tests + q.private_tests, q.func_name) for q in questions]
    return [jobs[i % len(jobs)] for i in range(count)]


def lcb_sample(tests, func_name) -> dict:
    io = {"inputs": [t.input for t in tests], "outputs": [t.output for t in tests], "fn_name": func_name}
    return {"input_output": json.dumps(io)}


def lcb_evaluation(checkout: Path):
    """lcb_runner's evaluation module, imported from the checkout as a package (its own
    `lcb_runner.*` imports resolve through the package's path)."""
    spec = importlib.machinery.PathFinder.find_spec("lcb_runner", [str(checkout)])
    if spec is None:
        raise SystemExit(f"{checkout}: no lcb_runner package there (a LiveCodeBench checkout?)")
    package = importlib.util.module_from_spec(spec)
    sys.modules["lcb_runner"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("lcb_runner.evaluation.compute_code_generation_metrics")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lcb_checkout", type=Path, help="a checkout of LiveCodeBench/LiveCodeBench")
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="graders.workers of grade_many, lcb_runner's num_process_evaluate",
    )
    parser.add_argument("--test-timeout", type=int, default=6, help="per-test bound of both graders")
    args = parser.parse_args()
    os.environ["TQDM_DISABLE"] = "1"  # lcb_runner's progress bar
    lcb = lcb_evaluation(args.lcb_checkout)

    jobs = programs(args.programs)
    cfg = GraderConfig(test_timeout_s=args.test_timeout, program_timeout_s=60.0, workers=args.workers)
    samples = [lcb_sample(tests, name) for _, tests, name in jobs]
    tests = sum(len(t) for _, t, _ in jobs)
    print(f"{len(jobs)} programs, {tests} tests; sandboxed: {isolation_available()}; workers: {args.workers}")

    def atlas() -> list[bool]:
        return [v.status == "passed" for v in grade_many(jobs, cfg=cfg)]

    def lcb_parallel() -> list[bool]:  # as its evaluation grades: num_process_evaluate processes
        results, _ = lcb.evaluate_generations(
            samples,
            [[code] for code, _, _ in jobs],
            debug=False,
            num_process_evaluate=args.workers,
            timeout=args.test_timeout,
        )
        return [all(r is True for r in results[i][0]) for i in range(len(jobs))]

    def lcb_serial() -> list[bool]:  # one check_correctness call at a time
        return [
            all(r is True for r in lcb.check_correctness(s, code, args.test_timeout, debug=False)[0])
            for s, (code, _, _) in zip(samples, jobs, strict=True)
        ]

    graders = {
        f"atlas, {args.workers} workers": atlas,
        f"lcb_runner, {args.workers} processes": lcb_parallel,
        "lcb_runner, one program at a time": lcb_serial,
    }
    seconds = dict.fromkeys(graders, 0.0)
    agree = True
    for round_ in range(args.rounds):
        passed = {}
        for name, grade in graders.items():
            start = time.perf_counter()
            passed[name] = grade()
            seconds[name] += time.perf_counter() - start
        agree = agree and all(ok == passed[next(iter(graders))] for ok in passed.values())
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{name} {sum(ok)}/{len(jobs)} passed" for name, ok in passed.items())
        )
    rate = {name: args.rounds * len(jobs) / s for name, s in seconds.items()}
    print("\n| grader | programs/s | tests/s | seconds | atlas / this |\n|---|---:|---:|---:|---:|")
    atlas_rate = rate[next(iter(graders))]
    for name in graders:
        print(
            f"| {name} | {rate[name]:.2f} | {rate[name] * tests / len(jobs):.1f} | {seconds[name]:.2f} "
            f"| {atlas_rate / rate[name]:.2f} |"
        )
    print(f"\nidentical verdicts: {agree}")


if __name__ == "__main__":
    main()
