"""A training job killed after its first checkpoint, on a copy of the pipeline run: the same
Snakemake command resumes it to the same bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from conftest import copy_pipeline, run_snakemake


def measured(df: pl.DataFrame) -> pl.DataFrame:
    """Drop what is measured rather than computed (timings, device readings)."""
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


def _training_pids(workdir: Path) -> list[int]:
    """The python processes running `-m atlas.stages.train` in `workdir` (not their shell wrapper)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            here = (proc / "cwd").resolve() == workdir.resolve()
        except OSError:
            continue
        if (
            here
            and b"-m" in argv
            and argv[argv.index(b"-m") + 1 : argv.index(b"-m") + 2] == [b"atlas.stages.train"]
        ):
            pids.append(int(proc.name))
    return pids


def test_killed_training_job_resumes_to_identical_checkpoints(pipeline, tmp_path):
    run = "training_smoke"  # 2 steps: killed after the first checkpoint, resumed for the second
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=(f"results/runs/{run}", f"results/checkpoints/{run}"))
    ckpts = wf / "results/checkpoints" / run
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", f"results/runs/{run}"]
    proc = subprocess.Popen(cmd, cwd=wf, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 900
    while not (ckpts / "step_1" / "MANIFEST.json").exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    (pid,) = _training_pids(wf)
    os.kill(pid, signal.SIGKILL)  # the job dies mid-run, as on a lost node or an OOM kill
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, output
    assert not (wf / "results/runs" / run).exists()
    survived = max(int(p.name[5:]) for p in ckpts.glob("step_*"))
    assert survived == 1

    run_snakemake(wf, "--cores", "2", f"results/runs/{run}")  # the same command again
    log = (wf / f"results/logs/train_{run}.log").read_text()
    assert f"resuming checkpoint=results/checkpoints/{run}/step_{survived} steps_done={survived} of=2" in log
    reference = pipeline / "results/checkpoints" / run
    for step in range(1, 3):
        names = sorted(p.name for p in (reference / f"step_{step}").iterdir())
        assert sorted(p.name for p in (ckpts / f"step_{step}").iterdir()) == names
        for name in names:
            assert (ckpts / f"step_{step}" / name).read_bytes() == (
                reference / f"step_{step}" / name
            ).read_bytes()
    for table in ("records.parquet", "step_metrics.parquet", "call_advantages.parquet", "validation.parquet"):
        a = measured(pl.read_parquet(wf / "results/runs" / run / table))
        b = measured(pl.read_parquet(pipeline / "results/runs" / run / table))
        assert a.equals(b), table
