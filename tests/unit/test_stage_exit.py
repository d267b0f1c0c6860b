"""How a stage's process ends (atlas.stage.run): without the interpreter's teardown, alone or as
a rank of a torchrun job (WORLD_SIZE > 1), with the exit status and the output of a plain
interpreter's exit."""

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
@pytest.mark.parametrize("world", [1, 2])
def test_a_stage_ends_with_its_status_and_output_and_no_teardown(how, status, stderr, world):
    proc = stage(how, world)
    assert proc.returncode == status
    assert proc.stdout == "unflushed output"
    assert stderr in proc.stderr
    assert "teardown ran" not in proc.stderr  # os._exit: no exit hooks, no destructors
    if how == "bad-input":  # the message alone, no traceback
        assert "Traceback" not in proc.stderr


def test_without_run_the_interpreter_would_run_the_teardown():
    """The reference the test above differs from: the same main() called bare."""
    program = PROGRAM.replace("run(main)", "main()")
    proc = subprocess.run([sys.executable, "-c", program, "ok"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "unflushed output"
    assert "teardown ran" in proc.stderr


def test_a_gpu_memory_claim_without_a_gpu_is_refused_before_main_runs():
    """ATLAS_GPU_MEM_GB (a job's resources.gpu_memory_gb claim) becomes torch's per-process
    memory fraction; where torch sees no GPU the stage stops with a message naming the claim."""
    env = {**os.environ, "ATLAS_GPU_MEM_GB": "20", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, "ok"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "error: ATLAS_GPU_MEM_GB=20: a GPU memory claim, but torch sees no GPU" in proc.stderr
    assert proc.stdout == ""  # main() never ran
    env["ATLAS_GPU_MEM_GB"] = "0"  # the rules' value when the config claims nothing
    assert subprocess.run([sys.executable, "-c", PROGRAM, "ok"], env=env, timeout=120).returncode == 0
