"""The training log's start-up: what `tracking.preload` imports before torch loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
