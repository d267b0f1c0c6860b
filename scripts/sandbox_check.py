"""Does the grader's sandbox start on this machine, and does it grade as elsewhere?

    python scripts/sandbox_check.py --out here.json          # on a workstation
    python scripts/sandbox_check.py --out node.json          # on the GPU node (bwrap on PATH)
    python scripts/sandbox_check.py --compare here.json node.json

Grades fixed programs (a correct one, a wrong one, a functional one returning a wrong value, a
sleeper past the test bound) against the shipped LiveCodeBench fixtures, and runs one program that
reports what it sees inside (uid, effective capabilities, no_new_privs, visible processes, a TCP
connect to 127.0.0.1). Prints the verdicts as JSON; --compare exits 1 if the verdicts of two
machines differ (the machine facts may).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from atlas.config.graders import GraderConfig
from atlas.data.lcb import parse_row
from atlas.graders import sandbox
from atlas.graders.lcb import grade_code

FIXTURES = Path(__file__).resolve().parents[1] / "resources" / "fixtures"
INSIDE = """import os, socket
status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
try:
    socket.create_connection(('127.0.0.1', 22), timeout=1); net = 'connected'
except OSError as e:
    net = f'refused errno {e.errno}'
procs = len([p for p in os.listdir('/proc') if p.isdigit()])
print(os.getuid(), status['CapEff'].strip(), status['NoNewPrivs'].strip(), procs, net)
"""


def programs(solutions: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, question id, code) of the graded programs."""
    return [
        ("stdin correct", "abc300_a", solutions["abc300_a"]),
        ("stdin wrong", "abc300_a", "print(1)"),
        ("functional correct", "9001", solutions["9001"]),
        ("functional wrong", "9003", "class Solution:\n    def countPairs(self, nums):\n        return -1\n"),
        ("sleeps past the bound", "abc300_a", "import time\ntime.sleep(9)"),
    ]


def check() -> dict:
    rows = {}
    for line in (FIXTURES / "lcb_train.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["question_id"]] = row
    solutions = json.loads((FIXTURES / "lcb_solutions.json").read_text())
    out = {
        "machine": {
            "python": sys.version.split()[0],
            "kernel": os.uname().release,
            "uid": os.getuid(),
            "bwrap": shutil.which("bwrap"),
            "sandboxed": sandbox.isolation_available(),
            "problem": sandbox.isolation_problem(),
        }
    }
    if out["machine"]["sandboxed"]:
        limits = sandbox.SandboxLimits(5.0, 1024, 5, 16, 64, 65536)
        out["machine"]["inside"] = sandbox.run_program(INSIDE, limits=limits).stdout.strip()
    cfg = GraderConfig(test_timeout_s=2.0, program_timeout_s=20.0)
    verdicts = {}
    for name, qid, code in programs(solutions):
        q = parse_row(rows[qid], FIXTURES / "lcb_train.jsonl", 1, "grade", 10**8)
        v = grade_code(code, q.public_tests + q.private_tests, func_name=q.func_name, cfg=cfg).to_json()
        verdicts[name] = {
            "status": v["status"],
            "passed": v["passed"],
            "total": v["total"],
            "sandboxed": v["sandboxed"],
            "tests": [[t["status"], t["detail"]] for t in v["tests"]],
        }
    out["verdicts"] = verdicts
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the JSON here too")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two outputs")
    args = p.parse_args()
    if args.compare:
        a, b = (json.loads(f.read_text())["verdicts"] for f in args.compare)
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        for k in differ:
            print(f"{k}:\n  {args.compare[0]}: {a.get(k)}\n  {args.compare[1]}: {b.get(k)}")
        print(f"{len(a.keys() | b.keys()) - len(differ)} verdicts equal, {len(differ)} differ")
        return 1 if differ else 0
    out = check()
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
