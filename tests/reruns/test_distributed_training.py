"""Data-parallel training on two gloo ranks (torchrun) against one process (the pipeline run's
training smoke), on a copy of the pipeline run: the same step metrics, records and trainable tensors within float tolerance, the same run-folder
shape, and a two-rank job whose torchrun is killed after its first checkpoint: its ranks end, and
it resumes to the same bytes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from atlas.config.study import config_slice, load_config
from atlas.hashing import verify
from conftest import alive, copy_pipeline, copy_workflow, run_snakemake, survivors

RUN = "training_smoke"  # 2 steps, a checkpoint after each, validation before and after
# Float32 sums in another order (half-batch sums, then the all-reduce) and batches padded to
# another width: differences stay near 1e-6 relative. A row on the wrong rank, a doubled or lost
# half-batch, or a rank-local whitening moves these values by far more than 1e-3.
RTOL, ATOL = 1e-3, 1e-5


def measured(df: pl.DataFrame) -> pl.DataFrame:
    """Drop what is measured rather than computed (timings, device readings)."""
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


@pytest.fixture(scope="module")
def inputs(pipeline, tmp_path_factory) -> Path:
    """A copy of the pipeline run: the training stage's inputs (data, tiny model), and its
    training smoke, the one-process run of RUN that the two-rank runs are compared with."""
    return copy_pipeline(pipeline, tmp_path_factory.mktemp("dp") / "wf")


def train_command(wf: Path, ranks: int, name: str) -> list[str]:
    s = config_slice(load_config(wf / "config" / "config.yaml"), "training", RUN)
    s["resources"]["ranks"] = None if ranks == 1 else ranks
    launch = (
        [sys.executable, "-m"]
        if ranks == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            "-m",
        ]
    )
    return [
        *launch,
        "atlas.stages.train",
        "--config-slice",
        json.dumps(s),
        "--train",
        "results/data/train.parquet",
        "--val",
        "results/data/val.parquet",
        "--tests",
        "results/data/tests.parquet",
        "--model",
        "results/models/tiny",
        "--checkpoints",
        f"results/checkpoints/{name}",
        "--out",
        f"results/runs/{name}",
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train(wf: Path, ranks: int, name: str) -> Path:
    proc = subprocess.run(
        train_command(wf, ranks, name), cwd=wf, env=ENV, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return wf / "results/runs" / name


# Run names: the pipeline's one-process run of RUN (Snakemake's train job, the same command as
# train_command(wf, 1, RUN)), and the two-rank run this module makes.
NAMES = {1: RUN, 2: "ranks2"}


@pytest.fixture(scope="module")
def runs(inputs) -> dict[int, Path]:
    return {1: inputs / "results/runs" / NAMES[1], 2: train(inputs, 2, NAMES[2])}


def close(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a), torch.as_tensor(b), rtol=RTOL, atol=ATOL)


def test_two_ranks_write_the_run_folder_of_one_process(runs, inputs, monkeypatch):
    monkeypatch.chdir(inputs)  # manifests name inputs relative to the workflow directory
    one, two = runs[1], runs[2]
    assert verify(two) == []
    # (Snakemake marks a finished directory output with .snakemake_timestamp: not the stage's.)
    listing = lambda run: sorted(  # noqa: E731
        p.relative_to(run).as_posix()
        for p in run.rglob("*")
        if "wandb" not in p.parts and p.name != ".snakemake_timestamp"
    )
    assert listing(two) == listing(one)
    assert pl.read_parquet(two / "validation.parquet").equals(pl.read_parquet(one / "validation.parquet"))
    # the same tokens, masks and scores; the rollout log-probs of a row differ in float noise
    # with the width of the batch it was generated in (half the episodes on each rank)
    a, b = (pl.read_parquet(r / "trajectories.parquet") for r in (one, two))
    assert a.drop("logprobs").equals(b.drop("logprobs"))
    for x, y in zip(a["logprobs"].to_list(), b["logprobs"].to_list(), strict=True):
        assert close(y, x)
    protocol = [json.loads((r / "protocol.json").read_text()) for r in (one, two)]
    assert protocol[0] == protocol[1]


def test_two_ranks_step_metrics_match_one_process(runs):
    a = measured(pl.read_parquet(runs[1] / "step_metrics.parquet"))
    b = measured(pl.read_parquet(runs[2] / "step_metrics.parquet"))
    assert a.columns == b.columns and a.height == b.height == 2
    for col in a.columns:
        if a[col].dtype.is_numeric() and a[col].null_count() == 0:  # declared but unset: null in both
            assert close(b[col].to_list(), a[col].to_list()), (col, a[col].to_list(), b[col].to_list())
        else:
            assert a[col].equals(b[col]), col
    # the update moved something: the comparison is not of two untouched policies
    assert all(abs(v) > 0 for v in a["actor/grad_norm"])


def test_two_ranks_records_match_one_process(runs):
    a = measured(pl.read_parquet(runs[1] / "records.parquet"))
    b = measured(pl.read_parquet(runs[2] / "records.parquet"))
    assert a.height == b.height > 0
    learned = ["value", "advantage"]
    assert a.drop(learned).equals(b.drop(learned))
    train = pl.col("phase") == "train"
    for col in learned:
        x, y = a.filter(train)[col].to_list(), b.filter(train)[col].to_list()
        assert close(y, x), col
    # whitened over the global batch: the step's advantages have mean 0 over sampled tokens, not
    # per rank; the records' values are read off both ranks' rows
    assert a.filter(train)["advantage"].n_unique() > 1


# AdamW's first steps move an element by about lr * sign(gradient); where a gradient element is
# near 0, float noise in it flips that sign. So the moments (the gradients' running means, which
# a lost, doubled or unsynced half-batch moves by 50% or more) are compared at rtol 1e-3, and the
# adapters to a tenth of the learning rate (1e-3 in the embedded default).
TOLERANCE = {
    "optim_actor": (1e-3, 1e-8),
    "optim_critic": (1e-3, 1e-8),
    "actor": (1e-3, 1e-4),
    "critic": (1e-3, 1e-4),
}


def test_two_ranks_train_the_same_tensors(runs, inputs):
    for step in (1, 2):
        for name, (rtol, atol) in TOLERANCE.items():
            a = load_file(str(inputs / f"results/checkpoints/{NAMES[1]}/step_{step}/{name}.safetensors"))
            b = load_file(str(inputs / f"results/checkpoints/ranks2/step_{step}/{name}.safetensors"))
            assert a.keys() == b.keys()
            off = [k for k in a if not torch.allclose(b[k], a[k], rtol=rtol, atol=atol)]
            assert not off, (step, name, off[:3])
    # the LoRA B matrices start at zero: trained ones are not
    actor = load_file(str(inputs / "results/checkpoints/ranks2/step_2/actor.safetensors"))
    assert any(t.abs().max() > 0 for k, t in actor.items() if "lora_B" in k)


def test_checkpoints_carry_each_ranks_generators(runs, inputs):
    state = json.loads((inputs / "results/checkpoints/ranks2/step_1/state.json").read_text())
    assert state["ranks"] == 2 and len(state["python_random_ranks"]) == 1
    rng = load_file(str(inputs / "results/checkpoints/ranks2/step_1/rng.safetensors"))
    assert {"torch", "torch.rank1"} <= set(rng)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_killed_two_rank_job_resumes_to_identical_bytes(runs, inputs):
    name = "ranks2_killed"
    ckpts = inputs / "results/checkpoints" / name
    proc = subprocess.Popen(
        train_command(inputs, 2, name),
        cwd=inputs,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(ckpts / "step_1" / "MANIFEST.json", proc, 900)
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
    finally:
        # torchrun is killed outright, so it cannot end its ranks: each rank has a death signal
        # for its parent (atlas.lifetime.die_with_parent), and none lives on beside the rerun
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)
    assert survivors(ranks, 30) == []
    assert not (inputs / "results/runs" / name).exists()
    assert max(int(p.name[5:]) for p in ckpts.glob("step_*")) == 1

    proc = subprocess.run(
        train_command(inputs, 2, name), cwd=inputs, env=ENV, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resuming checkpoint=results/checkpoints/{name}/step_1 steps_done=1 of=2" in proc.stderr
    reference = inputs / "results/checkpoints/ranks2"
    for step in (1, 2):
        names = sorted(p.name for p in (reference / f"step_{step}").iterdir())
        assert sorted(p.name for p in (ckpts / f"step_{step}").iterdir()) == names
        for file in names:
            assert (ckpts / f"step_{step}" / file).read_bytes() == (
                reference / f"step_{step}" / file
            ).read_bytes(), (
                step,
                file,
            )
    for table in ("records.parquet", "step_metrics.parquet", "call_advantages.parquet", "validation.parquet"):
        a = measured(pl.read_parquet(inputs / "results/runs" / name / table))
        b = measured(pl.read_parquet(runs[2] / table))
        assert a.equals(b), table


def test_a_rank_ends_with_its_launcher_before_it_meets_the_other(inputs):
    """Rank 1 of a two-rank job alone (rank 0 never starts), its launcher SIGKILLed while the rank
    loads torch: the rank ends. Without its death signal it would wait at the rendezvous for
    rank 0 until the timeout, as a NCCL rank waits in a collective whose peers are gone."""
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank_env = {
        **ENV,
        **{"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "alone"},
    }
    command = train_command(inputs, 2, "rank1_alone")
    rank_command = [sys.executable, "-m", *command[command.index("atlas.stages.train") :]]
    launch = "import subprocess, sys; p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); p.wait()"
    launcher = subprocess.Popen(
        [sys.executable, "-c", launch, *rank_command],
        cwd=inputs,
        env=rank_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    rank = int(launcher.stdout.readline())
    deadline = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{rank}/maps").read_text():  # past its start, loading torch
        assert alive(rank) and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert survivors([rank], 20) == []


def test_the_train_rule_launches_torchrun_for_two_ranks(tmp_path):
    wf = copy_workflow(tmp_path)
    cfg = wf / "config" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("  threads: 1", "  threads: 1\n  ranks: 2"))
    proc = run_snakemake(wf, "--cores", "2", "-n", "-p", f"results/runs/{RUN}")
    assert "torchrun --standalone --nproc-per-node 2 -m atlas.stages.train" in proc.stdout
