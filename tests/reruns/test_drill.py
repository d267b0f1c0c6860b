"""scripts/drill.sh on a copy of the pipeline run: the training smoke killed at its first
checkpoint (SIGKILL to Snakemake's session), then the same Snakemake command with
--rerun-incomplete resumes it from that checkpoint to the metrics the uninterrupted run wrote."""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl

from conftest import REPO, copy_pipeline, run_snakemake

RUN = "training_smoke"


def computed(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


def test_a_drilled_run_resumes_from_its_checkpoint_to_the_same_metrics(pipeline, tmp_path):
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=(f"results/runs/{RUN}", f"results/checkpoints/{RUN}"))
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    drill = subprocess.run(
        ["bash", str(REPO / "scripts" / "drill.sh"), RUN, "--cores", "1"],
        cwd=wf,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert drill.returncode == 0, drill.stdout[-3000:] + drill.stderr[-3000:]
    said = [line for line in drill.stdout.splitlines() if line.startswith("drill:")]
    assert said[0].startswith("drill: killed Snakemake's session (SIGKILL)"), said
    assert "MANIFEST.json existed" in said[0]
    ckpts = wf / "results" / "checkpoints" / RUN
    assert [p.name for p in ckpts.glob("step_*")] == ["step_1"] and said[
        1
    ] == "drill: checkpoints left: step_1 "
    assert not (wf / "results" / "runs" / RUN / "step_metrics.parquet").exists()

    # a trainer the kill missed would still hold the run's lock, and this job would stop on it
    run_snakemake(wf, f"results/runs/{RUN}", "--cores", "1", "--rerun-incomplete", timeout=900)
    log = (wf / "results" / "logs" / f"train_{RUN}.log").read_text()
    assert f"resuming checkpoint=results/checkpoints/{RUN}/step_1 steps_done=1 of=2" in log
    got = computed(pl.read_parquet(wf / "results" / "runs" / RUN / "step_metrics.parquet"))
    want = computed(pl.read_parquet(pipeline / "results" / "runs" / RUN / "step_metrics.parquet"))
    assert got.equals(want)
