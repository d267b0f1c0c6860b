"""How a stage's process ends (atlas.stage.run): without the interpreter's teardown, alone or as
a rank of a torchrun job (WORLD_SIZE > 1), with the exit status and the output of a plain
interpreter's exit."""

from __future__ import annotations

import os
import re
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


LOGGING = """
import logging, sys
from pathlib import Path
from atlas.rl.journal import open_root
from atlas.stage import log, run

def main():
    root = Path(sys.argv[1]) / "arm"
    (root / "step_1").mkdir(parents=True)  # earlier work without a fingerprint
    open_root(root, {"config": 1}, "auto", "arm")
    log("arm", "the stage's own line", steps=2)
    logging.getLogger("filelock").info("another library's line")

run(main)
"""


def test_a_stage_shows_the_library_log_lines_as_its_own(tmp_path):
    """Library modules log through their own `logging` loggers; run() puts the lines of those
    under `atlas` on stderr in the stage's own format, and no other library's INFO lines."""
    proc = subprocess.run(
        [sys.executable, "-c", LOGGING, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [re.fullmatch(r"\[\d\d:\d\d:\d\d\] (.*)", line) for line in proc.stderr.splitlines()]
    assert [m and m.group(1) for m in lines] == [
        f"arm: earlier work has no fingerprint; moved aside to={tmp_path / 'arm.stale-unfingerprinted'}",
        "arm: the stage's own line steps=2",
    ]
