"""Where one graded program's time goes: starting its sandbox, each test, closing it.

    python scripts/bench_sandbox.py [--times 15] [--test-timeout 6]

Grades abc300_a's reference solution (the fixtures', on its 5 tests) `--times` times through
atlas.graders.sandbox.Sandbox, alone, and prints the median milliseconds of each phase: starting
the sandbox (until the driver is ready for the program), one test, and closing the sandbox.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from atlas.config import GraderConfig
from atlas.data.lcb import read_lcb
from atlas.graders.sandbox import Sandbox, SandboxLimits, isolation_available

FIXTURES = Path(__file__).resolve().parent.parent / "resources" / "fixtures"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=15)
    parser.add_argument("--test-timeout", type=int, default=6)
    args = parser.parse_args()
    question = next(
        q for q in read_lcb(FIXTURES / "lcb_train.jsonl", "train") if q.record_id.endswith("abc300_a")
    )
    code = json.loads((FIXTURES / "lcb_solutions.json").read_text(encoding="utf-8"))[question.record_id]
    tests = question.public_tests + question.private_tests
    limits = SandboxLimits.from_config(GraderConfig(test_timeout_s=args.test_timeout))
    isolation_available()  # the probe, once, outside the figures
    phases: dict[str, list[float]] = {"start the sandbox": [], "one test": [], "close the sandbox": []}
    for _ in range(args.times):
        t0 = time.perf_counter()
        box = Sandbox(code, mode="stdin", limits=limits)
        t1 = time.perf_counter()
        for test in tests:
            run = box.run(test.input, timeout_s=args.test_timeout, keep_bytes=1 << 16)
            if run.status != "ok":
                raise SystemExit(f"abc300_a's reference solution gave {run.status}: {run.stderr}")
        t2 = time.perf_counter()
        box.close()
        seconds = (t1 - t0, (t2 - t1) / len(tests), time.perf_counter() - t2)
        for name, value in zip(phases, seconds, strict=True):
            phases[name].append(value)
    print(f"abc300_a, {len(tests)} tests, median of {args.times}; sandboxed: {isolation_available()}")
    print("\n| phase | ms |\n|---|---|")
    for name, values in phases.items():
        print(f"| {name} | {statistics.median(values) * 1000:.1f} |")


if __name__ == "__main__":
    main()
