"""Shared test helpers: the repository, its fixtures, and copies of the workflow to edit.

The suite is in four folders, each test marked with its folder's name (`-m unit`, ...):
- `unit/`: the library in this process (and its CLIs, graders, the tiny model): no Snakemake,
  no training process;
- `workflow/`: reads the one pipeline run (the `pipeline` fixture), never changes it;
- `reruns/`: Snakemake plans and runs, and training processes, on copies of the workflow or of
  the pipeline run;
- `gpu/`: needs CUDA (skips without it).
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ci_skips import pytest_runtest_makereport  # noqa: F401  (the hook: no guarantee skips in CI)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "resources" / "fixtures"
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "profiles", "envs", "src", "resources", "report")
FOLDERS = ("unit", "workflow", "reruns", "gpu")


def pytest_collection_modifyitems(items) -> None:
    """Mark each test with its folder (the markers in pyproject.toml)."""
    for item in items:
        folder = item.path.parent.name
        if folder in FOLDERS:
            item.add_marker(folder)


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


def plan_rows(workdir: Path, targets: list[str], configfiles: list[str] = ()) -> list[dict[str, str]]:
    """The Snakemake API's plan for `targets` in `workdir`: one row per output file, with its
    rule and plan ("no update", "update pending", ...). One planning process answers every
    query of the session (plans.Planner), each with the workflow copy's own `src/`."""
    from plans import planner

    return planner().rows(workdir, targets, configfiles)


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


KEPT_RUNS = 3  # cached pipeline runs kept (the newest), each about 20 MB


def workflow_key() -> str:
    """sha256 of what a pipeline run depends on: the workflow's files (paths and bytes), the
    interpreter and the versions of the packages the stages run. Equal keys, equal runs."""
    from importlib import metadata

    digest = hashlib.sha256()
    for part in WORKFLOW_PARTS:
        root = REPO / part
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(REPO)
            if "__pycache__" in rel.parts or any(x.endswith(".egg-info") for x in rel.parts):
                continue
            digest.update(f"{rel}\0{path.stat().st_size}\0".encode() + path.read_bytes())
    packages = ("torch", "transformers", "peft", "xgrammar", "snakemake", "polars", "pyarrow", "wandb")
    digest.update(repr([sys.executable, sys.version, *(metadata.version(p) for p in packages)]).encode())
    return digest.hexdigest()[:20]


@pytest.fixture(scope="session")
def pipeline(request, tmp_path_factory) -> Path:
    """A copy of the workflow after `snakemake --cores 2` of its default target (every job),
    run once per state of the tree: it is kept in pytest's cache folder under the workflow's key,
    so a session on an unchanged tree reuses it. Tests read it and must not change it; copy it
    (`copy_pipeline`) to edit or rerun."""
    if getattr(request.config, "cache", None) is None:  # -p no:cacheprovider: a fresh run
        wf = copy_workflow(tmp_path_factory.mktemp("pipeline"))
        run_snakemake(wf, "--cores", "2", timeout=1800)
        return wf
    cache = Path(request.config.cache.mkdir("atlas-pipeline"))
    done = cache / workflow_key()
    if not done.is_dir():
        partial = Path(tempfile.mkdtemp(prefix=f"{done.name}.partial-", dir=cache))
        run_snakemake(copy_workflow(partial), "--cores", "2", timeout=1800)
        try:
            partial.rename(done)  # atomic: a run is in the cache whole or not at all
        except OSError:  # another session finished the same run first
            shutil.rmtree(partial, ignore_errors=True)
    runs = sorted((p for p in cache.iterdir() if ".partial-" not in p.name), key=lambda p: p.stat().st_mtime)
    for old in runs[:-KEPT_RUNS]:
        if old != done:
            shutil.rmtree(old, ignore_errors=True)
    return done


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
