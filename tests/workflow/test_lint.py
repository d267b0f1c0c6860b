"""The workflow lints and formats clean: `snakemake --lint`, `snakefmt --check`, `ruff check`,
`ruff format --check`."""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_lint_and_format_are_clean():
    lint = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True
    )
    assert (
        lint.returncode == 0
        and "Congratulations, your workflow is in a good condition!" in lint.stdout + lint.stderr
    )
    snakefmt = shutil.which("snakefmt", path=str(Path(sys.executable).parent)) or "snakefmt"
    fmt = subprocess.run([snakefmt, "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_python_lint_and_format_are_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    for args in (
        ["check", "src", "tests", "scripts", "tools"],
        ["format", "--check", "src", "tests", "scripts", "tools"],
    ):
        proc = subprocess.run([ruff, *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
