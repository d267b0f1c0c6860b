"""The training log's start-up: what `tracking.preload` imports before torch loads, and an offline
log that never calls out."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

# In a fresh interpreter, as a training job starts: preload, then (for the offline mode) the run
# itself; prints which modules each part imported.
PROBE = """
import json, sys
from atlas.rl import tracking
mode, folder = sys.argv[1], sys.argv[2]
tracking.preload(mode)
after_preload = set(sys.modules)
out = {"wandb": "wandb" in after_preload, "torch": "torch" in after_preload}
if mode != "disabled":
    import wandb
    run = wandb.init(mode=mode, dir=folder, project="p", settings=wandb.Settings(silent=True, console="off"))
    run.finish()
    out["imported_by_init"] = sorted(m for m in set(sys.modules) - after_preload if m.startswith("wandb"))
print(json.dumps(out))
"""


def _probe(mode: str, folder: Path) -> dict:
    env = {
        "PYTHONPATH": str(REPO / "src"),
        "HOME": str(folder),
        "WANDB_SILENT": "true",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_preload_imports_what_wandb_init_imports_and_no_torch(tmp_path):
    got = _probe("offline", tmp_path)
    assert got["wandb"] and not got["torch"]
    # init found its pydantic-heavy modules loaded; a wandb whose init imports more needs them in
    # tracking.preload
    assert got["imported_by_init"] == [], got["imported_by_init"]


def test_a_disabled_log_imports_no_wandb(tmp_path):
    assert _probe("disabled", tmp_path) == {"wandb": False, "torch": False}


# A training job's offline log, as the stage keeps it: preload, start, a logged row, finish, and
# the interpreter's own exit (where wandb's exit hooks would send what they hold).
OFFLINE_RUN = """
import sys
from pathlib import Path
from atlas.rl import tracking
folder = Path(sys.argv[1])
tracking.preload("offline")
run = tracking.start(folder, mode="offline", project="p", run_id="r1", name="n", config={"a": 1})
run.log({"x": 1.0}, step=0)
run.finish()
"""


def test_an_offline_log_opens_no_network_connection(tmp_path):
    """Every connect() of the job's process tree (wandb's Go service included), traced: only
    local sockets. A name lookup or a connection to wandb's server would show as an AF_INET or
    AF_INET6 connect (the resolver is reached the same way)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install -y strace)")
    trace = tmp_path / "connect.trace"
    env = {"PYTHONPATH": str(REPO / "src"), "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    proc = subprocess.run(
        [
            strace,
            "-f",
            "-qq",
            "-e",
            "trace=connect",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            OFFLINE_RUN,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.glob("wandb/offline-run-*-r1/run-r1.wandb")), sorted(tmp_path.rglob("*"))[:20]
    connects = [line for line in trace.read_text().splitlines() if "connect(" in line]
    assert connects, "the trace saw no connect() at all: wandb's local service socket is one"
    remote = [line for line in connects if re.search(r"AF_INET6?\b", line)]
    assert remote == [], remote
