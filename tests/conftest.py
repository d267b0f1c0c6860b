"""Shared test helpers: the repository, its fixtures, and copies of the workflow to edit."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "resources" / "fixtures"
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "profiles", "envs", "src", "resources")


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, lineterminator="\r\n").writerows([header, *rows])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow (no results, no .snakemake) to run and edit in isolation."""
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


PLAN_SCRIPT = """
import contextlib, io, json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

targets, configfiles = json.loads(sys.argv[1]), json.loads(sys.argv[2])
buf = io.StringIO()
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    wf = api.workflow(
        resource_settings=ResourceSettings(cores=1),
        config_settings=ConfigSettings(configfiles=[Path(p) for p in configfiles]),
        snakefile=Path("Snakefile"),
        workdir=Path("."),
    )
    dag = wf.dag(dag_settings=DAGSettings(targets=set(targets)))
    with contextlib.redirect_stdout(buf):
        dag.summary(detailed=False)
    dag.execute_workflow(executor="dryrun")  # the plan must also pass a full dry run
rows = [line.split("\\t") for line in buf.getvalue().splitlines() if line.strip()]
header = rows[0]
print(json.dumps([dict(zip(header, row)) for row in rows[1:]]))
"""


def plan_rows(workdir: Path, targets: list[str], configfiles: list[str] = ()) -> list[dict[str, str]]:
    """The Snakemake API's plan for `targets` in `workdir`: one row per output file, with its
    rule and plan ("no update", "update pending", ...).

    Runs in a fresh interpreter so the workflow's own `src/` is the atlas package it imports."""
    proc = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT, json.dumps(targets), json.dumps(list(configfiles))],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"planning failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plan(workdir: Path, targets: list[str], configfiles: list[str] = ()) -> dict[str, list[str]]:
    """rule -> the plan values of its outputs."""
    out: dict[str, set[str]] = {}
    for row in plan_rows(workdir, targets, configfiles):
        out.setdefault(row["rule"], set()).add(row["plan"])
    return {rule: sorted(p) for rule, p in out.items()}


def outputs_to_run(workdir: Path, targets: list[str]) -> set[str]:
    """The output files the plan would (re)build."""
    return {row["output_file"] for row in plan_rows(workdir, targets) if row["plan"] != "no update"}


def jobs_to_run(workdir: Path, targets: list[str]) -> set[str]:
    return {rule for rule, plans in plan(workdir, targets).items() if plans != ["no update"]}


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy one fixture file into tmp_path and return its path, to break it in place."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copy2(FIXTURES / name, dest)
        return dest

    return copy


def _build_model(out: Path, **tiny_overrides) -> Path:
    from atlas.config import config_slice, load_config

    s = config_slice(load_config(REPO / "config" / "config.yaml"), "model")
    s["model"]["tiny"].update(tiny_overrides)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas.stages.build_tiny_model",
            "--config-slice",
            json.dumps(s),
            "--out",
            str(out),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The embedded default's model, built once per test session."""
    return _build_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """results/data/ of the embedded default, prepared once per test session."""
    from atlas.config import config_slice, load_config
    from atlas.stages import prepare_data

    out = tmp_path_factory.mktemp("data")
    s = config_slice(load_config(REPO / "config" / "config.yaml"), "data")
    for source in ("gpqa", "lcb"):
        for split in ("train", "val"):
            s["data"][source][split] = str(REPO / s["data"][source][split])
    prepare_data.main(["--config-slice", json.dumps(s), "--out", str(out)])
    return out


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory) -> Path:
    """A copy of the workflow after `snakemake --cores 2` of its default target (data, model,
    smoke, boundary, the training runs, the dose step), run once per test session. Tests read it
    and must not change it; copy it (`copy_pipeline`) to edit or rerun."""
    wf = copy_workflow(tmp_path_factory.mktemp("pipeline"))
    run_snakemake(wf, "--cores", "2", timeout=1800)
    return wf


def copy_pipeline(src: Path, dest: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """A copy of a finished workflow directory (results and Snakemake's metadata included, mtimes
    kept), without the paths in `drop`."""
    shutil.copytree(
        src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
    )
    for rel in drop:
        target = dest / rel
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    return dest
