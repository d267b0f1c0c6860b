"""A training job killed the moment its first checkpoint lands, on a copy of the pipeline run: the
same Snakemake command resumes it to the same bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import polars as pl

from atlas.config.study import config_slice, load_config
from atlas.rl.tracking import read_history
from conftest import copy_pipeline, run_snakemake


def measured(df: pl.DataFrame) -> pl.DataFrame:
    """Drop what is measured rather than computed (timings, device readings)."""
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


# The trainer as Snakemake runs it, except that the process kills itself (SIGKILL) the moment its
# first checkpoint is on disk: the narrowest window between a checkpoint and the journal of the
# step before it.
DIE_AFTER_FIRST_SAVE = """
import os, signal, sys
import atlas.rl.checkpoint as checkpoint
import atlas.stages.train as stage
real = checkpoint.save_compact
def save_then_die(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.save_compact = save_then_die  # the stage imports it when it runs
sys.argv = ["atlas.stages.train", *sys.argv[1:]]
stage.run(stage.main)
"""


def test_killed_training_job_resumes_to_identical_checkpoints(pipeline, tmp_path):
    run = "training_smoke"
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=(f"results/runs/{run}", f"results/checkpoints/{run}"))
    s = config_slice(load_config(wf / "config" / "config.yaml"), "training", run)
    args = ["--config-slice", json.dumps(s), "--checkpoints", f"results/checkpoints/{run}"]
    args += ["--out", f"results/runs/{run}", "--model", "results/models/tiny"]
    for split in ("train", "val", "tests"):
        args += [f"--{split}", f"results/data/{split}.parquet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    died = subprocess.run(
        [sys.executable, "-c", DIE_AFTER_FIRST_SAVE, *args],
        cwd=wf,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    ckpts = wf / "results/checkpoints" / run
    assert [p.name for p in ckpts.glob("step_*")] == ["step_1"]
    assert (ckpts / "journal/step_0/metrics.json").is_file()  # written before step_1 existed

    run_snakemake(wf, "--cores", "2", f"results/runs/{run}")  # the workflow's own command resumes it
    log = (wf / f"results/logs/train_{run}.log").read_text()
    assert f"resuming checkpoint=results/checkpoints/{run}/step_1 steps_done=1 of=2" in log
    reference = pipeline / "results/checkpoints" / run
    for step in (1, 2):
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
    # one wandb log in the run folder, every step in it once: the killed attempt's log moved aside,
    # and the resumed job replayed the journal into a new one
    (wandb_file,) = (wf / "results/runs" / run / "wandb").rglob("*.wandb")
    history = {row["_step"]: row for row in read_history(wandb_file)}
    assert (
        sorted(history) == [0, 1, 2] and "val/all/utility" in history[0] and "val/all/utility" in history[2]
    )
    metrics = pl.read_parquet(wf / "results/runs" / run / "step_metrics.parquet")
    for row in metrics.iter_rows(named=True):
        assert history[row["step"] + 1]["actor/pg_loss"] == row["actor/pg_loss"]
    assert (ckpts / "wandb.earlier-1").is_dir() and not (ckpts / "wandb.earlier-2").exists()
    # the save the kill interrupted was never timed; the resumed step's save was
    saves = pl.read_parquet(wf / "results/runs" / run / "step_metrics.parquet")["timing_s/save_checkpoint"]
    assert saves[0] is None and saves[1] > 0
