"""scripts/offline_node.sh refuses what it cannot do with a message that says what to do: a pack
without the clone's .venv or into the clone itself, a run outside a packed folder, an unknown
step. (Packing and running themselves download 100 MB and need a GPU node: docs/gpu.md.)"""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO


def script(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(cwd / "scripts" / "offline_node.sh"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_its_usage_names_both_halves():
    proc = script()
    assert proc.returncode == 2
    assert "bash scripts/offline_node.sh pack DIR [LIST]" in proc.stderr
    assert "bash DIR/scripts/offline_node.sh run [drill] [pipeline] [bench] [tests]" in proc.stderr


def test_pack_needs_the_clones_venv_and_another_folder(tmp_path):
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "offline_node.sh", clone / "scripts")
    proc = script("pack", str(tmp_path / "out"), cwd=clone)
    assert (
        proc.returncode == 1
        and f"no {clone}/.venv/bin/python: set the clone up first (README)" in proc.stderr
    )
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "python").symlink_to(shutil.which("python3"))
    proc = script("pack", str(clone), cwd=clone)
    assert proc.returncode == 1 and proc.stderr.strip() == "offline_node: DIR must not be the clone itself"


def test_run_needs_a_packed_folder():
    proc = script("run", "pipeline")  # the clone has no wheels/ of its own
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"offline_node: no {REPO}/wheels: run this from a packed DIR"
