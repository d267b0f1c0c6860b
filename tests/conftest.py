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

import contextlib
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from ci_skips import pytest_runtest_makereport  # noqa: F401  (the hook: no guarantee skips in CI)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "resources" / "fixtures"
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "profiles", "envs", "src", "resources", "report", ".test")
FOLDERS = ("unit", "workflow", "reruns", "gpu")


def require_bubblewrap() -> None:
    """Skip a sandbox test where bubblewrap cannot start; under ATLAS_REQUIRE_ISOLATION=1 (CI),
    fail instead: isolation is a guarantee there."""
    from atlas.graders.sandbox import isolation_available, isolation_problem

    if not isolation_available():
        message = f"bubblewrap cannot start here: {isolation_problem()}"
        if os.environ.get("ATLAS_REQUIRE_ISOLATION") == "1":
            pytest.fail(message)
        pytest.skip(message)


# The modules that read the run and take longest, in the order the workers get them, so that the
# two end close together: a worker gets its next module once the one it runs has two tests left,
# so a long module of one test goes first (it is handed out with the one after it), then the
# others longest first, and the short ones last. (The order that did best in a simulation of
# xdist's hand-out over the measured times of each test.)
LONGEST_FIRST = (
    "test_training_resume.py",
    "test_resume_recovery.py",
    "test_slurm.py",
    "test_regrade.py",
    "test_drill.py",
    "test_snakemake_report.py",
    "test_pipeline.py",
    "test_checks.py",
    "test_integrity_rerun.py",
)

# The modules that need no run and spend their time waiting (on sandboxes' timeouts and
# deadlines, a killed process's end) rather than computing, first among those: they run beside
# the pipeline run, whose jobs use the core they leave, not after it, where nothing would.
WAITING_FIRST = (
    "test_sandbox_run.py",
    "test_graders.py",
    "test_sandbox_isolation.py",
    "test_execute.py",
    "test_lcb_verdicts.py",
    "test_recovery.py",
    "test_sandbox_attacks.py",
)


def pytest_collection_modifyitems(items) -> None:
    """Mark each test with its folder (the markers in pyproject.toml), and order the modules so
    that two processes (pytest-xdist, a module to a worker) overlap the pipeline run with the
    tests that do not wait for it: first one module that reads the run (its worker starts the
    run), then every module that needs no run (those that mostly wait, WAITING_FIRST, first),
    then the rest, the longest (LONGEST_FIRST) first. The order within a module is kept."""
    for item in items:
        folder = item.path.parent.name
        if folder in FOLDERS:
            item.add_marker(folder)
    reads_run = {item.path for item in items if "pipeline" in item.fixturenames}
    first = next((item.path for item in items if item.path in reads_run), None)
    rank = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    heavy = {name: i for i, name in enumerate(LONGEST_FIRST)}
    waiting = {name: i for i, name in enumerate(WAITING_FIRST)}
    items.sort(
        key=lambda item: (
            item.path != first,
            item.path in reads_run,
            heavy.get(item.path.name, len(heavy)),
            waiting.get(item.path.name, len(waiting)),
            rank[item.path],
        )
    )


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): two workers for a run of folders (the suite's default: a
    2-core machine, so the pipeline run shares its cores with the tests that need none) or of
    several named files (the verl environment's tests), one process for a run of one named file
    or of named tests. `-n 0` keeps any run in one process."""
    cores = min(2, len(os.sched_getaffinity(0)))
    named = [a for a in config.args if ".py" in a]
    if not named or len(named) < len(config.args):
        return cores
    files = {a.split("::")[0] for a in named}
    return cores if len(files) > 1 and not any("::" in a for a in named) else 0


def pytest_configure(config) -> None:
    # Each worker runs its in-process torch on one thread: two workers share two cores.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


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


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie (ended, not yet reaped) does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def survivors(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after up to `seconds` of waiting for them all to end.
    Each of them is then killed (SIGKILL): a failed test leaves nothing running."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def waits_for_question(question: str, call) -> None:
    """Assert that `call()` waits while another program of `question` holds its lock, and ends once
    the lock is let go (a program alone takes about 0.1 s)."""
    from atlas.graders.sandbox import QuestionLock

    done = threading.Event()
    held = QuestionLock(question)
    try:
        worker = threading.Thread(target=lambda: (call(), done.set()))
        worker.start()
        assert not done.wait(0.5)
    finally:
        held.release()
    worker.join(30)
    assert done.is_set()


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte in place, same size, and set the mtime back as it was."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def policy_with_optimizers(model_dir: Path, training):
    """An ActorCritic over the model at `model_dir`, with an AdamW and a decaying LambdaLR per
    role: the state a compact checkpoint holds."""
    import torch
    from transformers import AutoModelForCausalLM

    from atlas.model.policy import ROLES, ActorCritic

    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(model_dir), training, seed=0)
    opts, scheds = {}, {}
    for role in ROLES:
        params = ac.trainable(role)
        opts[role] = torch.optim.AdamW([params[n] for n in sorted(params)], lr=1e-2)
        scheds[role] = torch.optim.lr_scheduler.LambdaLR(opts[role], lambda s: 1.0 / (1 + s))
    return ac, opts, scheds


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m snakemake ARGS` in workdir; a failure (with `check`) or a run past `timeout`
    fails the test, never a hang."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        env=env,
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


def _build_model(out: Path) -> Path:
    """The embedded default's model, built into `out` by the build stage's main() in this process
    (the pipeline runs the same stage as a Snakemake job), in the repository as its working folder:
    the config names the tokenizer's corpus, and the manifest its files, relative to it."""
    from atlas.config.study import config_slice, load_config
    from atlas.stages import build_tiny_model

    s = config_slice(load_config(REPO / "config" / "config.yaml"), "model")
    with contextlib.chdir(REPO):
        build_tiny_model.main(["--config-slice", json.dumps(s), "--out", str(out)])
    return out


def session_root(tmp_path_factory) -> Path:
    """A folder of this test session that its pytest-xdist workers share (each worker's basetemp
    is a folder in it); without workers, the session's basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(done: Path, make) -> Path:
    """`done`, made by `make(folder)` if it is not there yet. A lock beside it makes a second
    process (another session on the same cache, another pytest-xdist worker) wait for the first
    one's folder instead of making its own; the rename makes a folder appear whole or not at all."""
    import fcntl

    with open(done.parent / f"{done.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_dir():
            partial = Path(tempfile.mkdtemp(prefix=f"{done.name}.partial-", dir=done.parent))
            try:
                make(partial)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            partial.rename(done)
    return done


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The embedded default's model, built once per test session (or the one ATLAS_TEST_TINY_MODEL
    names, built by tools/mutation.py once for all the sessions of a mutation run)."""
    if prebuilt := os.environ.get("ATLAS_TEST_TINY_MODEL"):
        return Path(prebuilt)
    return shared(session_root(tmp_path_factory) / "tiny-model", lambda d: _build_model(d / "tiny")) / "tiny"


@pytest.fixture(scope="session")
def played(tmp_path_factory, tiny_model, data_dir):
    """Four episodes played through verl's agent loop and locally, once for the verl tests that
    read them (test_verl_agent_loop.py, test_verl_actor.py; verl's environment only)."""
    from test_verl_agent_loop import play_both_ways

    return play_both_ways(tmp_path_factory.mktemp("verl_loop"), tiny_model, data_dir)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """results/data/ of the embedded default, prepared once per test session (or the folder
    ATLAS_TEST_DATA_DIR names, as for tiny_model)."""
    if prebuilt := os.environ.get("ATLAS_TEST_DATA_DIR"):
        return Path(prebuilt)
    return shared(session_root(tmp_path_factory) / "data", prepare_data_dir)


@pytest.fixture(scope="session")
def training_inputs(tiny_model, data_dir):
    """A training job's inputs over the embedded default's data and the tiny model."""
    from atlas.runtime.inputs import TrainingInputs

    return TrainingInputs(
        train=data_dir / "train.parquet",
        val=data_dir / "val.parquet",
        tests=data_dir / "tests.parquet",
        model=tiny_model,
    )


def prepare_data_dir(out: Path) -> Path:
    """Prepare results/data/ of the embedded default into the existing folder `out`."""
    from atlas.config.study import config_slice, load_config
    from atlas.stages import prepare_data

    s = config_slice(load_config(REPO / "config" / "config.yaml"), "data")
    for source in ("gpqa", "lcb"):
        for split in ("train", "val"):
            s["data"][source][split] = str(REPO / s["data"][source][split])
    prepare_data.main(["--config-slice", json.dumps(s), "--out", str(out)])
    return out


KEPT_RUNS = 3  # cached pipeline runs kept (the newest)

# The suite's pipeline run is the embedded default made small (.test/config/config.yaml merged
# over config/config.yaml, as `--configfile` merges it): every rule of the DAG, both arms, in
# fewer steps and on fewer validation questions.
SUITE_CONFIG = REPO / ".test" / "config" / "config.yaml"


def suite_config_raw() -> dict:
    import yaml

    from atlas.config.study import merged

    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    return merged(base, yaml.safe_load(SUITE_CONFIG.read_text(encoding="utf-8")))


def suite_config():
    """The typed config of the suite's pipeline run (what `pipeline`'s config/config.yaml holds)."""
    from atlas.config.study import parse_config

    return parse_config(suite_config_raw(), str(SUITE_CONFIG))


def workflow_key() -> str:
    """sha256 of what a pipeline run depends on: the workflow's files (paths and bytes), the
    suite's config, the interpreter and the versions of the packages the stages run. Equal keys,
    equal runs."""
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


def run_pipeline(dest: Path) -> Path:
    """A copy of the workflow whose config/config.yaml is the suite's config, after `snakemake
    --cores 2` of its default target (every job). In the copy a plain `snakemake` plans against
    that config, so reruns on copies of it need no --configfile."""
    import yaml

    wf = copy_workflow(dest)
    (wf / "config" / "config.yaml").write_text(
        yaml.safe_dump(suite_config_raw(), sort_keys=False), encoding="utf-8"
    )
    run_snakemake(wf, "--cores", "2", timeout=1800)
    return wf


@pytest.fixture(scope="session")
def pipeline(request, tmp_path_factory) -> Path:
    """A copy of the workflow after one run of the suite's config (`run_pipeline`), once per
    state of the tree: it is kept in pytest's cache folder under the workflow's key, so a session
    on an unchanged tree reuses it (with -p no:cacheprovider, once per session). Tests read it and
    must not change it; copy it (`copy_pipeline`) to edit or rerun."""
    if getattr(request.config, "cache", None) is None:  # -p no:cacheprovider: a fresh run
        # Under pytest-xdist each worker has its own basetemp; their parent is the session's.
        return shared(session_root(tmp_path_factory) / "pipeline", run_pipeline)
    cache = Path(request.config.cache.mkdir("atlas-pipeline"))
    done = shared(cache / workflow_key(), run_pipeline)
    runs = sorted(
        (p for p in cache.iterdir() if p.is_dir() and ".partial-" not in p.name),
        key=lambda p: p.stat().st_mtime,
    )
    for old in runs[:-KEPT_RUNS]:
        if old != done:
            shutil.rmtree(old, ignore_errors=True)
            (cache / f"{old.name}.lock").unlink(missing_ok=True)
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
