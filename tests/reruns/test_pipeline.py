"""The workflow itself: the DAG through the Snakemake API, a real run, and what reruns after an edit."""

import subprocess
import sys

import yaml

from atlas.hashing import verify
from conftest import copy_pipeline, copy_workflow, jobs_to_run, plan, plan_rows, run_snakemake

TARGETS = ["results/data/val.parquet", "results/models/tiny"]


def test_dry_run_plans_data_and_model_through_the_api(tmp_path):
    wf = copy_workflow(tmp_path)
    p = plan(wf, TARGETS)
    assert set(p) == {"prepare_data", "build_tiny_model"}
    assert p["prepare_data"] == ["update pending"] and p["build_tiny_model"] == ["update pending"]


def test_report25_plan_names_every_missing_user_input_before_any_job(tmp_path):
    # The real study reads the user's question files and model folder; a workflow copy has none of
    # them. The plan stops before the DAG is built, naming each one with the key that expects it.
    wf = copy_workflow(tmp_path)
    proc = run_snakemake(wf, "-n", "results/report25/", "--configfile", "config/report25.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "missing inputs (snakemake config): 5 paths the config names are not there" in out
    named = [line.strip().split("; expected ")[0] for line in out.splitlines() if "; expected " in line]
    assert named == [
        "data.gpqa.train: data/gpqa/gpqa_train.csv does not exist",
        "data.gpqa.val: data/gpqa/gpqa_diamond.csv does not exist",
        "data.lcb.train: data/lcb/lcb_train.jsonl does not exist",
        "data.lcb.val: data/lcb/test6.jsonl does not exist",
        "model.path: models/qwen-27b does not exist",
    ]
    expected = {
        line.split(": ")[0].strip(): line.split("; expected ")[1]
        for line in out.splitlines()
        if "; expected " in line
    }
    assert expected["data.gpqa.val"].startswith(
        "the GPQA validation questions: a CSV with the upstream columns (Question,"
    )
    assert expected["data.gpqa.val"].endswith("Record ID), 198 of them")
    assert expected["data.lcb.train"].startswith(
        "the LiveCodeBench training problems: a code_generation_lite JSONL"
    )
    assert expected["data.lcb.train"].endswith(", 140 of them")
    assert expected["model.path"] == (
        "a local Hugging Face model folder: config.json, *.safetensors weights and the tokenizer's files"
    )
    assert "MissingInputException" not in out and "Building DAG" not in out
    assert not (wf / "results").exists()


def test_verl_engine_plans_the_same_dag_as_local(tmp_path):
    # engine: verl swaps the module a training job runs (atlas.stages.train_verl), nothing else: the
    # same jobs, the same outputs, the same plan from an empty results/.
    wf = copy_workflow(tmp_path)
    (wf / "verl.yaml").write_text(yaml.safe_dump({"training": {"engine": "verl"}}))
    local = plan_rows(wf, ["results/report25/"])
    verl = plan_rows(wf, ["results/report25/"], ["verl.yaml"])
    key = lambda rows: sorted((r["rule"], r["output_file"], r["plan"]) for r in rows)  # noqa: E731
    assert key(verl) == key(local)
    assert {r["rule"] for r in local} >= {"train", "checks", "validation", "report"}
    proc = run_snakemake(wf, "-n", "-p", "results/runs/zero_potential", "--configfile", "verl.yaml")
    assert "python -m atlas.stages.train_verl --config-slice" in proc.stdout
    assert "python -m atlas.stages.train " not in proc.stdout


def test_run_then_nothing_then_exactly_the_edited_stage(pipeline, tmp_path):
    # A copy of the pipeline run: its data and model jobs ran there, in another folder.
    wf = copy_pipeline(pipeline, tmp_path / "wf")
    assert verify(wf / "results" / "data", check_sources=False) == []
    assert verify(wf / "results" / "models" / "tiny", check_sources=False) == []
    # The manifests name the code each stage ran, as paths in this copy, and they still match.
    proc = subprocess.run(
        [sys.executable, "-m", "atlas", "verify", "results/data", "results/models/tiny"],
        cwd=wf,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout

    assert jobs_to_run(wf, TARGETS) == set()

    # touch reruns nothing: neither source files nor inputs.
    for f in [*(wf / "src").rglob("*.py"), *(wf / "resources" / "fixtures").iterdir()]:
        f.touch()
    assert jobs_to_run(wf, TARGETS) == set()

    # An edit to the GPQA reader reruns exactly the data stage.
    gpqa = wf / "src" / "atlas" / "data" / "gpqa.py"
    gpqa.write_text(gpqa.read_text() + "\n# a grader-independent edit\n")
    assert jobs_to_run(wf, TARGETS) == {"prepare_data"}

    # An edit to the tiny model module reruns exactly the model stage (and still the data stage).
    tiny = wf / "src" / "atlas" / "model" / "tiny.py"
    tiny.write_text(tiny.read_text() + "\n# edit\n")
    assert jobs_to_run(wf, TARGETS) == {"prepare_data", "build_tiny_model"}
    # Shared code reruns both.
    run_snakemake(wf, "--cores", "2", *TARGETS)
    assert jobs_to_run(wf, TARGETS) == set()

    # A config key reruns only the stage whose slice holds it.
    cfg = yaml.safe_load((wf / "config" / "config.yaml").read_text())
    cfg["model"]["tiny"]["seed"] = 7
    (wf / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert jobs_to_run(wf, TARGETS) == {"build_tiny_model"}
    cfg["schedule"]["seed"] = 3
    (wf / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert jobs_to_run(wf, TARGETS) == {"build_tiny_model", "prepare_data"}


def test_failed_data_job_leaves_no_outputs_and_says_why(tmp_path):
    wf = copy_workflow(tmp_path)
    (wf / "resources" / "fixtures" / "lcb_val.jsonl").write_text("")
    proc = run_snakemake(wf, "--cores", "1", "results/data/val.parquet", check=False)
    assert proc.returncode != 0
    log = (wf / "results" / "logs" / "prepare_data.log").read_text()
    assert "error: resources/fixtures/lcb_val.jsonl: file is empty" in log
    assert not (wf / "results" / "data" / "val.parquet").exists()
    assert "file is empty" in proc.stdout + proc.stderr  # show-failed-logs prints it
