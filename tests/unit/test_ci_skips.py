"""The CI skip rule (tests/ci_skips.py) on a suite written here: under CI=true a skip fails the run
unless the test, or the module that skipped whole, is marked with a need this machine lacks
(`gpu` without CUDA, `verl` without verl); a reason's words excuse nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SUITE = """
import pytest

def test_isolation():
    pytest.skip("`unshare --net --pid` is not permitted here")

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_gpu():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_says_cuda_but_is_not_marked():
    pass

@pytest.mark.verl
def test_verl():
    pytest.importorskip("verl.not_a_module_here")

def test_says_verl_but_is_not_marked():
    pytest.skip("could not import 'verl.trainer': No module named 'verl'")
"""

MARKED_MODULE = """
import pytest

pytestmark = [pytest.mark.verl, pytest.mark.filterwarnings("ignore")]
pytest.importorskip("verl.not_a_module_here")

def test_never_collected():
    pass
"""

UNMARKED_MODULE = """
import pytest

pytest.importorskip("verl.not_a_module_here", reason="the verl environment")

def test_never_collected():
    pass
"""


def run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "test_marked_module.py").write_text(MARKED_MODULE)
    (tmp_path / "test_unmarked_module.py").write_text(UNMARKED_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # tests/, where ci_skips is
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "ci_skips", "-p", "no:cacheprovider", "-rA"),
            "--continue-on-collection-errors",  # (a failed module would stop the run before the tests)
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skip_fails_under_ci_unless_marked_with_a_need_the_machine_lacks(tmp_path):
    from ci_skips import LACKING

    no_gpu, no_verl = LACKING["gpu"](), LACKING["verl"]()  # what the suite's process will see too
    proc = run(tmp_path, ci=True)
    out = proc.stdout
    assert proc.returncode != 0, out
    # a skip in the test's body fails it; a skipif mark's skip fails its setup (an error)
    failed = ["test_isolation", "test_says_verl_but_is_not_marked"] + ([] if no_verl else ["test_verl"])
    errors = ["test_suite.py::test_says_cuda_but_is_not_marked", "test_unmarked_module.py"]
    errors += ([] if no_gpu else ["test_suite.py::test_gpu"]) + ([] if no_verl else ["test_marked_module.py"])
    for name in failed:
        assert f"FAILED test_suite.py::{name} - skipped under CI" in out, out
    for name in errors:
        assert f"ERROR {name} - skipped under CI" in out, out
    skipped = 7 - len(failed) - len(errors)  # of 5 tests and 2 modules
    summary = out.strip().splitlines()[-1]
    for count in (f"{len(failed)} failed", f"{skipped} skipped", f"{len(errors)} errors"):
        assert re.search(rf"\b{count}\b", summary), summary
    assert "(its markers of need: none): Skipped: `unshare --net --pid` is not permitted here" in out


def test_outside_ci_skips_stay_skips(tmp_path):
    proc = run(tmp_path, ci=False)
    assert proc.returncode == 0 and "7 skipped" in proc.stdout, proc.stdout
