"""A byte flipped in a stage's input stops the Snakemake job that reads it, naming the file and
the folder to rebuild; the command it suggests rebuilds the folder."""

import os
import subprocess
import sys

from atlas.hashing import verify
from conftest import copy_pipeline, flip_byte, run_snakemake


def test_training_refuses_a_flipped_byte_in_its_data(pipeline, tmp_path):
    """A byte flipped in results/data/train.parquet: the training job stops naming the file and
    the folder to rebuild, before it writes anything; the data folder is left as it was."""
    run = ("results/runs/training_smoke", "results/checkpoints/training_smoke")
    wf = copy_pipeline(pipeline, tmp_path / "wf", drop=run)
    train = wf / "results" / "data" / "train.parquet"
    flip_byte(train, train.stat().st_size // 2)
    flipped = train.read_bytes()
    proc = run_snakemake(wf, "--cores", "1", "results/runs/training_smoke", check=False)
    assert proc.returncode != 0
    log = (wf / "results" / "logs" / "train_training_smoke.log").read_text()
    assert log.startswith("error: input folder results/data does not match its MANIFEST.json:\n")
    assert "  results/data/train.parquet: sha256 " in log
    assert (
        "rebuild results/data before this stage reads it (snakemake --force results/data/train.parquet)"
        in log
    )
    assert not (wf / "results" / "checkpoints" / "training_smoke").exists()
    assert not (wf / "results" / "runs" / "training_smoke").exists()
    assert train.read_bytes() == flipped  # nothing written is touched
    # `atlas verify` says the same of the folder
    check = subprocess.run(
        [sys.executable, "-m", "atlas", "verify", "--skip-sources", "results/data"],
        cwd=wf,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(wf / "src")},
    )
    assert check.returncode == 1 and "MISMATCH results/data/train.parquet: sha256 " in check.stdout
    # the suggested command rebuilds it, and training then runs on good data
    run_snakemake(wf, "--cores", "1", "--force", "results/data/train.parquet", "results/data/MANIFEST.json")
    assert verify(wf / "results" / "data", check_sources=False) == []
