"""Where the test suite's CPU goes: every Python process it starts, by kind, with its own CPU time.

    python tools/suite_cpu.py [PYTEST ARGS ...]      # default: -p no:cacheprovider (a cold run)

For the length of one `python -m pytest` run, a `.pth` file in this environment's site-packages
imports a hook module that records each Python process's CPU time (its own, not its children's)
when it ends, also through `os._exit` (how the stages end), into a log; the table groups the
processes by kind (a stage module, Snakemake, a torchrun launcher, the pytest workers, `atlas
grade`). Processes killed by a
signal write nothing, and graded programs run in the sandbox's interpreter, so the table's total
is a little below the run's CPU time, which /usr/bin/time around this command gives.

The last line gives the machine's busy and idle core-seconds over the run (from /proc/stat): busy
counts every process, the run's or not (the SLURM daemons and the jobs slurmd starts are not its
children), so on a quiet machine it is the run's whole cost, and idle is what better packing could
still win.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import site
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = """
import os, resource, sys, atexit
_log = os.environ.get("ATLAS_SUITE_CPU_LOG")
if _log:
    def _record():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        argv = " ".join(sys.argv).replace("\\t", " ").replace("\\n", " ")[:300]
        line = "%.3f\\t%s\\n" % (ru.ru_utime + ru.ru_stime, argv)
        try:
            fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            os.write(fd, line.encode())
            os.close(fd)
        except OSError:
            pass
    _exit = os._exit
    def _recorded_exit(code, _exit=_exit):
        _record()
        _exit(code)
    os._exit = _recorded_exit
    atexit.register(_record)
"""


def kind(argv: str) -> str:
    if "torch/distributed/run" in argv or "torchrun" in argv.split(" -m ")[0]:
        return "torchrun (the launcher)"
    if m := re.search(r"stages[/.](\w+)", argv):
        return f"stage {m.group(1)}"
    if "snakemake" in argv.split(" -")[0] or "-m snakemake" in argv:
        return "snakemake -n" if re.search(r"(^| )-n( |$)", argv) else "snakemake"
    if "__main__.py grade" in argv:
        return "atlas grade"
    if argv.startswith("-c") or "pytest" in argv:
        return "pytest (workers, planners, helpers)"
    return argv[:50]


NAME = "atlas_suite_cpu_hook"


def core_seconds(stat: str) -> tuple[float, float]:
    """(busy, idle) core-seconds since boot from the text of /proc/stat: its first line, `cpu
    user nice system idle iowait irq softirq steal ...`, in clock ticks. Busy is user, nice,
    system, irq and softirq; idle is idle and iowait; steal (another guest's) is neither."""
    fields = stat.splitlines()[0].split()
    if fields[0] != "cpu" or len(fields) < 8:
        raise ValueError(
            f"/proc/stat: expected a first line 'cpu user nice system idle ...', got {fields[:3]}"
        )
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in fields[1:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, (idle + iowait) / tick


def main(argv: list[str]) -> int:
    packages = Path(site.getsitepackages()[0])
    hook, pth = packages / f"{NAME}.py", packages / f"{NAME}.pth"
    if hook.exists() and hook.read_text(encoding="utf-8") != HOOK:
        raise SystemExit(f"{hook} exists and is not this script's hook")
    log = Path(tempfile.mkdtemp(prefix="suite-cpu-")) / "processes.tsv"
    # a .pth line that starts with `import` runs at every interpreter's start, before any
    # sitecustomize (which a system Python may ship, and which would shadow one of ours)
    hook.write_text(HOOK, encoding="utf-8")
    pth.write_text(f"import {NAME}\n", encoding="utf-8")

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)  # the hook comes out on these too, not only on Ctrl-C
    try:
        args = argv or ["-p", "no:cacheprovider"]
        env = {**os.environ, "ATLAS_SUITE_CPU_LOG": str(log)}
        before = core_seconds(Path("/proc/stat").read_text())
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", *args], env=env).returncode
        after = core_seconds(Path("/proc/stat").read_text())
    finally:
        pth.unlink(missing_ok=True)
        hook.unlink(missing_ok=True)
    if not log.exists():
        print(f"no process recorded its CPU time in {log}", file=sys.stderr)
        return rc or 1
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for line in log.read_text(encoding="utf-8").splitlines():
        cpu, _, command = line.partition("\t")
        by_kind[kind(command)].append(float(cpu))
    total = sum(map(sum, by_kind.values()))
    print(f"\n{'processes':>9} {'cpu s':>8} {'share':>6}  kind")
    for name, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"{len(cpus):>9} {sum(cpus):>8.1f} {sum(cpus) / total:>6.1%}  {name}")
    print(f"{sum(map(len, by_kind.values())):>9} {total:>8.1f}         recorded ({log})")
    busy, idle = after[0] - before[0], after[1] - before[1]
    print(
        f"the machine over the run: {busy:.0f} busy core-s, {idle:.0f} idle core-s ({busy / (busy + idle):.0%} busy)"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
