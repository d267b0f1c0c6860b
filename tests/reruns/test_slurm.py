"""The pipeline through a real single-node SLURM cluster (scripts/slurm_local.sh, Debian's
slurm-wlm + munge) with `snakemake --profile profiles/slurm-local`.

A copy of the pipeline run (tests/conftest.py) without its smoke and training smoke runs those two
jobs again as sbatch jobs: each job is checked in squeue and by its SLURM log, the outputs are
compared with the pipeline run's own (the local run of the same jobs on the same inputs), a rerun
plans nothing, and a job that fails under SLURM fails the workflow with its log.

Needs root and the packages (`apt-get install -y slurm-wlm munge`, `pip install -e '.[slurm]'`).
Under CI (CI=true) a missing package fails the test; elsewhere it skips. CI installs the executor
plugin beside the environment, in the folder that ATLAS_SLURM_PLUGIN names (.ci/run): only this
module's Snakemake processes and their jobs find it, on their PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from atlas.hashing import is_bookkeeping
from conftest import REPO, copy_pipeline, copy_workflow, run_snakemake

SCRIPT = REPO / "scripts" / "slurm_local.sh"
SLICE = ["results/runs/smoke", "results/runs/training_smoke"]
SLICE_OUTPUTS = [*SLICE, "results/checkpoints/training_smoke"]  # what the two jobs write
SLICE_RULES = {"smoke", "train"}
# Columns and keys that hold measured times or machine readings: the only values of a run that
# differ between two runs of the same inputs (DESIGN: timing_s/*, perf/*).
# Files that are measurements through and through: sampled CPU / memory / GPU readings.
MEASURED_FILES = {"samples.json", "device_samples.json"}
MEASURED = re.compile(r"^(timing_s/|perf/)|(_s|_seconds|_time|_at)$|^(created|duration|elapsed)")


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# The executor plugin's folder when it is not installed in this environment, else None.
PLUGIN = os.environ.get("ATLAS_SLURM_PLUGIN")


def _why_not_slurm() -> str | None:
    """What this machine lacks to run the cluster, or None."""
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "squeue") if not shutil.which(t)]
    found = (
        (Path(PLUGIN) / "snakemake_executor_plugin_slurm" / "__init__.py").is_file()
        if PLUGIN
        else importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
    )
    if not found:
        missing.append("snakemake-executor-plugin-slurm")
    if missing:
        return f"missing {missing}: apt-get install -y slurm-wlm munge; pip install -e '.[slurm]'"
    return "slurmd needs root" if os.geteuid() != 0 else None


WHY_NOT = _why_not_slurm()
# Outside CI a machine without SLURM skips the cluster's tests before any fixture is set up (the
# pipeline run included); under CI they run and fail in the cluster fixture.
needs_slurm = pytest.mark.skipif(WHY_NOT is not None and os.environ.get("CI") != "true", reason=str(WHY_NOT))


def _require_slurm() -> None:
    if WHY_NOT is not None:
        pytest.fail(f"the SLURM test must run in CI: {WHY_NOT}")


def _pids(state: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text().strip()) for p in (state / "run").glob("*.pid")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running local cluster; the environment that points sbatch/squeue at it."""
    _require_slurm()
    state = tmp_path_factory.mktemp("slurm") / "cluster"
    up = subprocess.run([SCRIPT, "up", state], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"export SLURM_CONF={state}/slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    if PLUGIN:  # Snakemake and the jobs it submits (sbatch passes the environment on) find it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [PLUGIN, os.environ.get("PYTHONPATH")]))
    pids = _pids(state)
    assert set(pids) == {"munged", "slurmctld", "slurmd"}
    # the one path outside the state folder: the default config path that jobs' srun reads
    assert os.readlink("/etc/slurm/slurm.conf") == str(state / "slurm.conf")
    # up again: the same cluster, nothing restarted
    again = subprocess.run([SCRIPT, "up", state], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == up.stdout and _pids(state) == pids
    yield env, state
    down = subprocess.run([SCRIPT, "down", state], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    # down stops what up started and leaves nothing behind
    assert not state.exists() and not os.path.lexists("/etc/slurm/slurm.conf")
    assert not [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()]
    node = "atlas" + __import__("hashlib").sha256(str(state).encode()).hexdigest()[:8]
    assert not list(Path("/sys/fs/cgroup").glob(f"*/slurm_{node}"))


def squeue_states(env: dict, job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Job id -> (state, comment), for jobs still listed (finished ones stay for MinJobAge).
    The plugin puts `rule_<rule>[_wildcards_<...>]` in each job's comment."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T %k"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return {job: (state, comment) for job, state, comment in (line.split() for line in out.splitlines())}


def slurm_jobs(workdir: Path) -> dict[str, list[str]]:
    """rule -> SLURM job ids, from the plugin's logs (.snakemake/slurm_logs/rule_<rule>/.../<id>.log)."""
    jobs: dict[str, list[str]] = {}
    for log in (workdir / ".snakemake" / "slurm_logs").rglob("*.log"):
        rule = next(p for p in log.relative_to(workdir / ".snakemake" / "slurm_logs").parts).removeprefix(
            "rule_"
        )
        jobs.setdefault(rule, []).append(log.stem)
    return jobs


def without_measured(value):
    """A JSON value without the keys that hold measured times or readings."""
    if isinstance(value, dict):
        return {k: without_measured(v) for k, v in value.items() if not MEASURED.search(k)}
    if isinstance(value, list):
        return [without_measured(v) for v in value]
    return value


def comparable(path: Path, same_bytes: set[str], root: Path):
    """A file's content with measured values left out: parquet frames and JSON without them; a
    MANIFEST.json by the files it lists (their names, and the hashes of those that are the same
    byte for byte in both runs); anything else as bytes."""
    if path.suffix == ".parquet":
        frame = pl.read_parquet(path)
        return frame.drop([c for c in frame.columns if MEASURED.search(c)])
    if path.name == "MANIFEST.json":
        manifest = json.loads(path.read_text())
        folder = path.parent.relative_to(root)
        files = {
            name: entry["sha256"] if str(folder / name) in same_bytes else None
            for name, entry in manifest["files"].items()
            if "wandb/" not in name
        }
        return {"keys": sorted(manifest), "files": files}
    if path.name in MEASURED_FILES:
        return "measured"
    if path.name == "adapter_config.json":
        # peft writes target_modules, a set, in the interpreter's hash order
        config = json.loads(path.read_text())
        return {**config, "target_modules": sorted(config["target_modules"])}
    if path.suffix == ".json":
        return without_measured(json.loads(path.read_text()))
    return path.read_bytes()


def tree(workdir: Path, folder: str) -> dict[str, Path]:
    """The files under workdir/folder, by their path in the workdir, without wandb's offline run
    folders (named by start time, holding system readings) and hash caches (keyed by inode and
    mtime): the same paths in two runs of the same inputs."""
    return {
        str(p.relative_to(workdir)): p
        for p in sorted((workdir / folder).rglob("*"))
        if p.is_file() and "/wandb/" not in str(p) and not is_bookkeeping(p.name)
    }


@needs_slurm
def test_slice_through_slurm_matches_a_local_run(cluster, failing_workflow, pipeline, tmp_path):
    env, state = cluster
    slurm = copy_pipeline(pipeline, mkdir(tmp_path / "slurm"), drop=tuple(SLICE_OUTPUTS))

    t0 = time.monotonic()
    proc = run_snakemake(slurm, "--profile", "profiles/slurm-local", *SLICE, env=env, timeout=900)
    print(f"\nslice {SLICE} through SLURM: {time.monotonic() - t0:.1f} s")

    # every job ran as a SLURM job: one log each under the run, its id known to the cluster
    jobs = slurm_jobs(slurm)
    assert set(jobs) == SLICE_RULES and all(len(ids) == 1 for ids in jobs.values()), jobs
    ids = [i for ids in jobs.values() for i in ids]
    listed = squeue_states(env, ids)
    assert sorted(listed) == sorted(ids), listed
    for rule, (job,) in jobs.items():
        state, comment = listed[job]
        assert state == "COMPLETED" and comment.startswith(f"rule_{rule}"), (rule, listed[job])
    submitted = set(re.findall(r"submitted with SLURM jobid (\d+)", proc.stdout + proc.stderr))
    assert submitted == set(ids)

    # the same outputs as the pipeline's local run: byte for byte, measured times left out
    local_files, slurm_files = {}, {}
    for out in SLICE_OUTPUTS:
        local_files |= tree(pipeline, out)
        slurm_files |= tree(slurm, out)
    assert sorted(slurm_files) == sorted(local_files) and local_files
    same_bytes = {r for r in local_files if local_files[r].read_bytes() == slurm_files[r].read_bytes()}
    differ = []
    for rel in local_files:
        if rel in same_bytes:
            continue
        a = comparable(local_files[rel], same_bytes, pipeline)
        b = comparable(slurm_files[rel], same_bytes, slurm)
        if not (a.equals(b) if isinstance(a, pl.DataFrame) else a == b):
            differ.append(rel)
    measured = sorted(set(local_files) - same_bytes - set(differ))
    print(
        f"{len(same_bytes)} of {len(local_files)} files byte-identical; equal without measured values: {measured}"
    )
    assert not differ, differ

    # a rerun through SLURM plans nothing
    rerun = run_snakemake(slurm, "--profile", "profiles/slurm-local", "-n", *SLICE, env=env)
    assert "Nothing to be done" in rerun.stdout + rerun.stderr


@pytest.fixture(scope="module")
def failing_workflow(cluster, tmp_path_factory):
    """A workflow whose first job fails under SLURM, started before the slice; its test reads how
    it ended. The slice waits until the job has failed (its log names the error), so that the job
    never queues behind the slice's jobs for a core: the plugin's status interval grows by 10 s at
    each check that sees no job end (2, 12, 22, ... s), and a job that ended late was seen only
    well after the slice was done. The workflow then sees the failure while the slice runs."""
    env, _ = cluster
    wf = copy_workflow(mkdir(tmp_path_factory.mktemp("failing") / "wf"))
    # A bad config value that only the job can see: data.lcb.val names a file of no LCB rows.
    (wf / "bad_lcb_val.jsonl").write_text('{"not": "an LCB row"}\n')
    (wf / "bad.yaml").write_text("data:\n  lcb:\n    val: bad_lcb_val.jsonl\n")
    args = ["--profile", "profiles/slurm-local", "results/data/train.parquet", "--configfile", "bad.yaml"]
    output = wf / "snakemake.out"  # a file, not a pipe: nothing reads it until the test
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snakemake", *args], cwd=wf, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        log = wf / "results" / "logs" / "prepare_data.log"
        deadline = time.monotonic() + 300
        while not (log.is_file() and "error:" in log.read_text()):
            assert proc.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.2)
        yield proc, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_slurm
def test_a_job_failing_under_slurm_fails_the_workflow_with_its_log(failing_workflow):
    proc, output = failing_workflow
    proc.wait(timeout=600)  # its job failed before the slice started
    out = output.read_text()
    assert proc.returncode != 0, out
    assert re.search(r"SLURM-job '\d+' failed", out), out
    # the job's own log is shown: the reader's error, naming the file and line (only the log has it)
    assert "Logfile results/logs/prepare_data.log:" in out, out
    assert "error: bad_lcb_val.jsonl, line 1: missing keys" in out, out


def test_the_profiles_differ_only_in_what_a_cluster_needs():
    """profiles/slurm and profiles/slurm-local: the same keys; values differ only in partition,
    account, GPU model, wall times, the local node's sizes and its status polling."""
    real = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    local = yaml.safe_load((REPO / "profiles/slurm-local/config.yaml").read_text())

    def leaves(d, prefix=()):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, (*prefix, k))
            else:
                yield (*prefix, k), v

    a, b = dict(leaves(real)), dict(leaves(local))
    assert set(a) == set(b)
    cluster_keys = {"slurm_partition", "slurm_account", "gpu_model", "runtime"}
    node_sizes = {"mem_mb", "cpus_per_task"}
    polling = {"slurm-status-command", "slurm-init-seconds-before-status-checks"}
    differ = {path for path in a if a[path] != b[path]}
    assert {
        p for p in differ if p[-1] not in cluster_keys | node_sizes | polling and p[0] != "set-threads"
    } == set()
    assert b[("executor",)] == "slurm" and b[("slurm-status-command",)] == "squeue"
