"""The repository's own promises: layout, fixtures we can regenerate, environments in step."""

import subprocess
import sys

import tomllib
import yaml

from conftest import FIXTURES, REPO


def test_layout_from_the_design():
    for part in (
        "Snakefile",
        "rules",
        "config",
        "profiles",
        "envs",
        "scripts",
        "src/atlas",
        "resources/fixtures",
        "tests",
    ):
        assert (REPO / part).exists(), part
    for profile in ("default", "slurm", "kubernetes"):
        assert (REPO / "profiles" / profile / "config.yaml").is_file()
    assert "/results/" in (REPO / ".gitignore").read_text().splitlines()


def test_fixtures_are_ours_and_reproducible(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_fixtures.py"), "--out", str(tmp_path)], check=True
    )
    shipped = sorted(p.name for p in FIXTURES.iterdir())
    assert shipped == sorted(p.name for p in tmp_path.iterdir())
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs" / "atlas.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert [d for d in pip if not d.startswith("-e")] == deps


def test_ci_runs_the_readme_commands():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for command in (
        "bash scripts/setup.sh",
        ". .venv/bin/activate",
        "python -m pytest\n",
        'ATLAS_REQUIRE_VERL=1 .venv-verl/bin/python -m pytest -m "not slow" tests/test_rl_math.py tests/test_verl_*.py',
    ):
        assert command in readme and command in ci, command
