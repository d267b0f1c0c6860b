"""scripts/job_times.py: per-job wall times from a Snakemake log, as Snakemake 9 writes it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from conftest import REPO

LOG = """\
Building DAG of jobs...
Select jobs to execute...
Execute 2 jobs...

[Thu Dec  3 21:47:11 2026]
localrule prepare_data:
    output: results/data/train.parquet
    log: results/logs/prepare_data.log
    jobid: 3
    reason: Missing output files: results/data/train.parquet
    resources: tmpdir=/tmp

[Thu Dec  3 21:47:11 2026]
localrule build_tiny_model:
    output: results/models/m
    jobid: 1
[Thu Dec  3 21:47:13 2026]
Finished jobid: 3 (Rule: prepare_data)
1 of 5 steps (20%) done
[Thu Dec  3 21:47:48 2026]
Finished jobid: 1 (Rule: build_tiny_model)
[Thu Dec  3 21:47:48 2026]
rule train:
    output: results/runs/training_smoke
    jobid: 4
    wildcards: run=training_smoke
    threads: 4
[Thu Dec  3 21:47:48 2026]
localrule dose_step:
    output: results/runs/dose_step
    jobid: 6
[Thu Dec  3 21:49:12 2026]
Finished jobid: 4 (Rule: train)
[Thu Dec  3 21:55:08 2026]
Error in rule dose_step:
    message: None
    jobid: 6
    output: results/runs/dose_step
[Thu Dec  3 21:55:08 2026]
localrule validation:
    jobid: 7
    wildcards: policy=base
"""


def module():
    spec = importlib.util.spec_from_file_location("job_times", REPO / "scripts" / "job_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_job_gets_its_start_end_and_status():
    jobs = module().job_times(LOG.splitlines())
    got = [
        (
            j["rule"],
            j["wildcards"],
            j["start"].strftime("%H:%M:%S"),
            j["end"] and j["end"].strftime("%H:%M:%S"),
            j["status"],
        )
        for j in jobs
    ]
    assert got == [
        ("prepare_data", "", "21:47:11", "21:47:13", "ok"),
        ("build_tiny_model", "", "21:47:11", "21:47:48", "ok"),
        ("train", "run=training_smoke", "21:47:48", "21:49:12", "ok"),
        ("dose_step", "", "21:47:48", "21:55:08", "error"),
        ("validation", "policy=base", "21:55:08", None, "running"),  # the log stops: cut short
    ]


def test_the_table_counts_seconds_from_the_first_start(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    out = tmp_path / "times.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "job_times.py"), str(log), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "| job | start (s) | end (s) | wall (s) | status |"
    assert "| build_tiny_model | 0 | 37 | 37 | ok |" in lines
    assert "| train run=training_smoke | 37 | 121 | 84 | ok |" in lines
    assert "| dose_step | 37 | 477 | 440 | error |" in lines
    assert "| validation policy=base | 477 | | | running |" in lines
    assert lines[-1] == "3 of 5 jobs finished; 477 s from the first start to the last end"
    assert [j["end"] for j in json.loads(out.read_text())][-2:] == ["2026-12-03T21:55:08", None]
