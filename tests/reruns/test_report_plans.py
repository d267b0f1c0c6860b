"""What Snakemake plans on the finished pipeline run and on copies of it: nothing on an unchanged
one, only the checks after a checks setting, only grader-dependent jobs after a grader fix; and
`atlas verify` names a changed report file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import copy_pipeline, jobs_to_run, outputs_to_run

REPORT = Path("results/report25")


def test_a_second_run_does_nothing_and_verify_passes(pipeline):
    assert jobs_to_run(pipeline, ["results/report25"]) == set()
    proc = subprocess.run(
        [sys.executable, "-m", "atlas", "verify", "results/report25"],
        cwd=pipeline,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok results/report25", proc.stdout + proc.stderr


def test_verify_names_a_changed_file(pipeline, tmp_path):
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=("results/checkpoints",))
    target = wf / REPORT / "tables" / "arms_validation_curve.csv"
    data = bytearray(target.read_bytes())
    data[-2] = ord("9") if data[-2] != ord("9") else ord("8")
    target.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "atlas", "verify", "results/report25"], cwd=wf, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "MISMATCH results/report25/tables/arms_validation_curve.csv: sha256" in proc.stdout
    assert proc.stdout.count("MISMATCH") == 1


def test_a_checks_setting_plans_only_the_checks_and_the_report_again(pipeline, tmp_path):
    """checks.resumed_steps is in the checks' slice alone: no training or validation reruns (the
    distributed roundtrip does: its rank files are a temp() input of the checks)."""
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=("results/checkpoints",))
    cfg = wf / "config" / "config.yaml"
    assert "resumed_steps: 1" in cfg.read_text()
    cfg.write_text(cfg.read_text().replace("resumed_steps: 1", "resumed_steps: all"))
    assert jobs_to_run(wf, ["results/report25"]) == {"distributed_roundtrip", "checks", "report"}


def test_a_training_key_plans_no_validation_of_the_base_the_adapters_shape_does(pipeline, tmp_path):
    """Full validation reads the adapters' shape alone of the training section: the group size
    reruns training and what reads the runs, never the base model's validation."""
    import yaml

    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=("results/checkpoints",))
    cfg = wf / "config" / "config.yaml"
    raw = yaml.safe_load(cfg.read_text())
    raw["training"]["responses_per_question"] += 1
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    planned = outputs_to_run(wf, ["results/report25"])
    assert "results/validation/zero_potential" in planned and "results/validation/base" not in planned
    raw["training"]["lora_alpha"] *= 2
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "results/validation/base" in outputs_to_run(wf, ["results/report25"])


def test_grader_fix_plans_only_the_grader_dependent_jobs(pipeline, tmp_path):
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=("results/checkpoints",))
    grader = wf / "src" / "atlas" / "graders" / "lcb.py"
    grader.write_text(grader.read_text() + "\n# a grader fix\n")
    arm = ["results/checks/zero_potential", "results/validation/zero_potential"]
    assert outputs_to_run(wf, arm) == {
        "results/runs/zero_potential",
        "results/checks/zero_potential.distributed",
        "results/checks/zero_potential",
        "results/validation/zero_potential",
    }
    # The whole report: everything that runs a grader, and nothing upstream of them.
    assert jobs_to_run(wf, ["results/report25"]) == {
        "smoke",
        "boundary",
        "train",
        "dose_step",
        "distributed_roundtrip",
        "checks",
        "validation",
        "report",
    }
    assert "results/data/train.parquet" not in outputs_to_run(wf, ["results/report25"])
