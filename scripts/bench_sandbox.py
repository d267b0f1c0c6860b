"""Where one graded program's time goes: starting its sandbox, each test, closing it.

    python scripts/bench_sandbox.py [--times 15] [--test-timeout 6]

Grades abc300_a's reference solution (the fixtures', on its 5 tests) `--times` times through
atlas.graders.sandbox.Sandbox, alone, and prints the median milliseconds of each phase: starting
the sandbox (until the driver is ready for the program), one test, and closing the sandbox; wall
time, and the CPU time of this process and every process it starts (bwrap, the driver, the tests),
which is what bounds grading throughput once every core is busy. CPU time is counted by a cgroup
v1 `cpuacct` hierarchy of the script's own (as root); elsewhere its column says n/a.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import time
from pathlib import Path

from atlas.config.graders import GraderConfig
from atlas.data.lcb import read_lcb
from atlas.graders.sandbox import Sandbox, SandboxLimits, isolation_available

FIXTURES = Path(__file__).resolve().parent.parent / "resources" / "fixtures"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def cpu_clock():
    """A function giving the CPU seconds of this process and its descendants so far, through a
    cpuacct cgroup this process moves into; None where there is none to make."""
    folder = CPUACCT / f"atlas-bench-sandbox-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    usage = folder / "cpuacct.usage"

    def leave() -> None:  # back to the parent; the cgroup goes once the last sandbox has exited
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):
            try:
                folder.rmdir()
                return
            except OSError:
                time.sleep(0.02)

    atexit.register(leave)
    return lambda: int(usage.read_text()) / 1e9


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
    cpu = cpu_clock() or (lambda: float("nan"))
    names = ("start the sandbox", "one test", "close the sandbox", "the whole program")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu_s: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.times):
        t0, c0 = time.perf_counter(), cpu()
        box = Sandbox(code, mode="stdin", limits=limits)
        t1, c1 = time.perf_counter(), cpu()
        for test in tests:
            run = box.run(test.input, timeout_s=args.test_timeout, keep_bytes=1 << 16)
            if run.status != "ok":
                raise SystemExit(f"abc300_a's reference solution gave {run.status}: {run.stderr}")
        t2, c2 = time.perf_counter(), cpu()
        box.close()
        t3, c3 = time.perf_counter(), cpu()
        n = len(tests)
        for name, w, c in zip(
            names,
            (t1 - t0, (t2 - t1) / n, t3 - t2, t3 - t0),
            (c1 - c0, (c2 - c1) / n, c3 - c2, c3 - c0),
            strict=True,
        ):
            wall[name].append(w)
            cpu_s[name].append(c)
    print(f"abc300_a, {len(tests)} tests, median of {args.times}; sandboxed: {isolation_available()}")
    print("\n| phase | wall ms | CPU ms |\n|---|---:|---:|")
    for name in names:
        c = statistics.median(cpu_s[name])
        print(
            f"| {name} | {statistics.median(wall[name]) * 1000:.1f} | {'n/a' if c != c else f'{c * 1000:.1f}'} |"
        )


if __name__ == "__main__":
    main()
