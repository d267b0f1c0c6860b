"""Snakemake stops on a bad config before any job: `snakemake -n` of the repository's workflow
with a broken config names the key and plans nothing."""

import subprocess
import sys

import yaml

from conftest import REPO


def default_raw() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def dry_run_with(tmp_path, raw: dict) -> tuple[int, str]:
    """`snakemake -n` of the repo's workflow with `raw` as the config, in an empty directory."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "snakemake", "-n", "--configfile", str(bad)]
    command += ["--directory", str(tmp_path), "--snakefile", str(REPO / "Snakefile")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_snakemake_stops_on_bad_config_before_any_job(tmp_path):
    raw = default_raw()
    raw["schedule"]["steps"] = -3
    code, out = dry_run_with(tmp_path, raw)
    assert code != 0
    assert "schedule.steps: Input should be greater than or equal to 1 (got -3)" in out
    assert "Building DAG" not in out
    assert not (tmp_path / "results").exists()


def test_snakemake_stops_when_a_token_cap_is_below_the_grammar_bound(tmp_path):
    raw = default_raw()
    raw["runtime"]["max_generation_tokens"] = 100
    code, out = dry_run_with(tmp_path, raw)
    assert code != 0
    assert "runtime.max_generation_tokens (100) must exceed the grammar's hard bound" in out
    assert "Building DAG" not in out
