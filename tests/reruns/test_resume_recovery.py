"""Faults around a training job, in scratch copies of the workflow: a truncated or altered
checkpoint (resume from the last good one, same bytes as an uninterrupted run), Snakemake killed
with SIGKILL (no orphan job; `--unlock` and a rerun finish the run), and a second writer on one
run (refused naming the pid; Snakemake keeps the checkpoints)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import alive, copy_pipeline, run_snakemake, survivors

RUN = "training_smoke"  # 2 steps, a checkpoint after each
TARGET = f"results/runs/{RUN}"
CKPTS = f"results/checkpoints/{RUN}"
TABLES = ("records.parquet", "step_metrics.parquet", "call_advantages.parquet", "validation.parquet")


def measured(df: pl.DataFrame) -> pl.DataFrame:
    """Drop what is measured rather than computed (timings, device readings)."""
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


def files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def trained(pipeline) -> Path:
    """The pipeline run: its training smoke is the uninterrupted run each fault is compared with,
    and each test works on a copy of it."""
    return pipeline


def assert_same_as_uninterrupted(wf: Path, reference: Path) -> None:
    for step in (1, 2):
        assert files(wf / CKPTS / f"step_{step}") == files(reference / CKPTS / f"step_{step}"), step
    for table in TABLES:
        a, b = (measured(pl.read_parquet(w / TARGET / table)) for w in (wf, reference))
        assert a.equals(b), table


def test_truncated_latest_checkpoint_resumes_from_the_one_before(trained, tmp_path):
    wf = copy_pipeline(trained, tmp_path / "wf", drop=(TARGET,))
    actor = wf / CKPTS / "step_2" / "actor.safetensors"
    whole = actor.read_bytes()
    actor.write_bytes(whole[: len(whole) // 2])  # a full disk, a killed copy
    run_snakemake(wf, "--cores", "2", TARGET)
    log = (wf / f"results/logs/train_{RUN}.log").read_text()
    aside = wf / f"{CKPTS}.corrupt-1"
    assert f"checkpoint step_2 is corrupt; moved aside to={aside.relative_to(wf) / 'step_2'}" in log
    assert f"resuming checkpoint={CKPTS}/step_1 steps_done=1 of=2" in log
    info = json.loads((wf / TARGET / "run.json").read_text())
    assert info["resumed_from_step"] == 1
    ((event),) = info["recovered"]
    assert event["moved"] == ["step_2"] and event["to"] == aside.relative_to(wf).as_posix()
    assert event["why"]["step_2"][0].startswith(f"{CKPTS}/step_2/actor.safetensors: size {len(whole) // 2}")
    assert (aside / "step_2" / "actor.safetensors").read_bytes() == whole[: len(whole) // 2]  # kept
    assert json.loads((aside / "why.json").read_text()) == event
    assert_same_as_uninterrupted(wf, trained)


def test_altered_checkpoints_and_none_left_start_over(trained, tmp_path):
    wf = copy_pipeline(trained, tmp_path / "wf", drop=(TARGET,))
    optim = wf / CKPTS / "step_2" / "optim_actor.safetensors"
    data = bytearray(optim.read_bytes())
    data[-3] ^= 0x10  # one byte of a moment tensor: same size, loads fine, trains on wrong state
    optim.write_bytes(bytes(data))
    (wf / CKPTS / "step_1" / "rng.safetensors").unlink()  # incomplete
    run_snakemake(wf, "--cores", "2", TARGET)
    log = (wf / f"results/logs/train_{RUN}.log").read_text()
    assert "no good checkpoint left: starting over" in log and "resuming checkpoint=" not in log
    info = json.loads((wf / TARGET / "run.json").read_text())
    assert info["resumed_from_step"] == 0
    ((event),) = info["recovered"]
    assert event["moved"] == ["step_1", "step_2"]
    assert event["why"]["step_1"] == [f"{CKPTS}/step_1/rng.safetensors: missing"]
    assert "optim_actor.safetensors: sha256 " in event["why"]["step_2"][0]
    assert (wf / f"{CKPTS}.corrupt-1" / "step_2" / "optim_actor.safetensors").read_bytes() == bytes(data)
    assert_same_as_uninterrupted(wf, trained)


def _wait(what, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while not (got := what()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited early: {proc.communicate()[0]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return got


def test_sigkill_to_snakemake_leaves_no_orphan_and_a_rerun_finishes(trained, tmp_path):
    wf = copy_pipeline(trained, tmp_path / "wf", drop=(TARGET, CKPTS, f"{CKPTS}.lock"))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", TARGET]
    smk = subprocess.Popen(cmd, cwd=wf, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = wf / f"{CKPTS}.lock"
    # The job holds its run's lock: it runs (atlas.rl.runlock.guard claims the lock only once the
    # job dies with its parent), before it loads torch, which a rerun would load again.
    job = _wait(lambda: lock.is_file() and int(lock.read_text().strip() or 0), 600, smk)
    assert alive(job)
    os.kill(smk.pid, signal.SIGKILL)  # Snakemake itself, only
    smk.wait()
    # the training job went with it, at once (an orphan is killed, not left behind)
    assert survivors([job], 5) == [], f"training job {job} outlived Snakemake"
    assert not (wf / TARGET).exists()  # killed mid-run: it did not finish on its own
    run_snakemake(wf, "--unlock")
    run_snakemake(wf, "--cores", "2", TARGET)
    assert json.loads((wf / TARGET / "run.json").read_text())["run"] == RUN
    assert_same_as_uninterrupted(wf, trained)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from atlas.rl.runlock import claim
    claim(sys.argv[1], sys.argv[2])
    print("held", flush=True)
    time.sleep(900)
    """
)


def test_a_second_writer_is_refused_and_snakemake_keeps_the_checkpoints(trained, tmp_path):
    wf = copy_pipeline(trained, tmp_path / "wf", drop=(TARGET,))
    before = files(wf / CKPTS)
    env = {**os.environ, "PYTHONPATH": str(wf / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, CKPTS, RUN], cwd=wf, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        proc = run_snakemake(wf, "--cores", "2", TARGET, check=False)
        assert proc.returncode != 0
        log = (wf / f"results/logs/train_{RUN}.log").read_text()
        assert f"run {RUN} is being written by pid {holder.pid}, which holds this lock" in log
        assert time.monotonic() - start < 120  # refused at once, not after training
    finally:
        holder.kill()
        holder.wait()
    assert files(wf / CKPTS) == before  # nothing written is lost or changed
    assert not (wf / TARGET).exists()
