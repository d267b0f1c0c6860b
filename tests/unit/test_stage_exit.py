"""How a stage's process ends (atlas.stage.run): as a rank of a torchrun job (WORLD_SIZE > 1)
without the interpreter's teardown, with the same exit status and output as a plain process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROGRAM = """
import sys
from atlas.errors import InputError
from atlas.stage import run

def main():
    sys.stdout.write("unflushed output")  # no newline, no flush: lost unless run() flushes
    how = sys.argv[1]
    if how == "bad-input":
        raise InputError("results/data/train.parquet: row 3 has no question")
    if how == "crash":
        raise RuntimeError("a bug")
    if how == "exit-3":
        raise SystemExit(3)
    if how == "exit-message":
        raise SystemExit("stopped: no checkpoint")

import atexit
atexit.register(lambda: print("teardown ran", file=sys.stderr))
run(main)
"""


def stage(how: str, world: int) -> subprocess.CompletedProcess:
    # buffered output (the default for a pipe), so that only an explicit flush brings it out
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "WORLD_SIZE": str(world)}
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, how], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "how, status, stderr",
    [
        ("ok", 0, ""),
        ("bad-input", 1, "error: results/data/train.parquet: row 3 has no question"),
        ("crash", 1, "RuntimeError: a bug"),
        ("exit-3", 3, ""),
        ("exit-message", 1, "stopped: no checkpoint"),
    ],
)
def test_a_rank_ends_with_the_status_and_output_of_a_plain_process_and_no_teardown(how, status, stderr):
    plain, rank = stage(how, 1), stage(how, 2)
    assert plain.returncode == rank.returncode == status
    assert plain.stdout == rank.stdout == "unflushed output"
    assert stderr in plain.stderr and stderr in rank.stderr
    assert "teardown ran" in plain.stderr  # the interpreter's exit ran the atexit hook
    assert "teardown ran" not in rank.stderr  # os._exit: no teardown, no destructors
