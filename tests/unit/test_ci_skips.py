"""The CI skip rule (tests/ci_skips.py) on a suite written here: under CI=true a skip for any
reason but a missing CUDA device or verl fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import pytest

def test_isolation():
    pytest.skip("`unshare --net --pid` is not permitted here")

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_gpu():
    pass

def test_verl():
    pytest.importorskip("verl.not_a_module_here")

def test_engine():
    pytest.skip("could not import 'verl.trainer': No module named 'verl'")
"""


def run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # tests/, where ci_skips is
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ci_skips", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_guarantee_that_skips_fails_under_ci(tmp_path):
    proc = run(tmp_path, ci=True)
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 3 skipped" in proc.stdout
    assert "FAILED test_suite.py::test_isolation" in proc.stdout
    assert "may skip: Skipped: `unshare --net --pid` is not permitted here" in proc.stdout


def test_outside_ci_skips_stay_skips(tmp_path):
    proc = run(tmp_path, ci=False)
    assert proc.returncode == 0 and "4 skipped" in proc.stdout, proc.stdout
