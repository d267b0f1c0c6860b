"""The training stages of the embedded default, run once by Snakemake (the `pipeline` fixture):
run folders, metrics, call advantages, wandb, checkpoints, the frozen potential, the dose step,
and a training job killed after its second checkpoint that resumes to the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from atlas.hashing import sha256_file, verify
from atlas.model.policy import ActorCritic
from atlas.rl.tracking import read_history
from conftest import suite_config

CFG = suite_config()  # the pipeline run's config
EPISODES_PER_STEP = CFG.schedule.questions_per_step * CFG.training.responses_per_question
VAL_EPISODES = CFG.training.validation_questions * CFG.training.validation_samples
# Steps, and the steps validated at (validation_every: 2, and the last step)
RUNS = {"training_smoke": 2, "zero_potential": 2, "frozen_potential": 2}
VALIDATED = {"training_smoke": [0, 2], "zero_potential": [0, 2], "frozen_potential": [0, 2]}
VERL_METRICS = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/grad_norm",
    "actor/lr",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/grad_norm",
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/returns/mean",
    "critic/values/mean",
    "critic/vf_explained_var",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "timing_s/adv",
    "timing_s/update_critic",
    "timing_s/update_actor",
    "timing_s/save_checkpoint",
    "timing_s/step",
    "perf/cpu_memory_used_gb",
]
PROTOCOL_METRICS = [
    f"protocol/{k}" for k in ("episodes", "completed", "generations", "records", "calls", "violations")
]


def measured(df: pl.DataFrame) -> pl.DataFrame:
    """Drop what is measured rather than computed (timings, device readings)."""
    return df.drop([c for c in df.columns if c.startswith(("timing_s/", "perf/"))])


@pytest.mark.parametrize("run", RUNS)
def test_a_training_run_writes_its_folder(pipeline, run, monkeypatch):
    monkeypatch.chdir(pipeline)  # manifests name inputs relative to the workflow directory
    folder = Path("results/runs") / run
    steps = RUNS[run]
    assert verify(folder) == []

    records = pl.read_parquet(folder / "records.parquet")
    train = records.filter(pl.col("phase") == "train")
    assert sorted(train["step"].unique()) == list(range(steps))
    assert train.select("step", "question_uid", "sample").unique().height == steps * EPISODES_PER_STEP
    assert train["value"].null_count() == 0 and train["advantage"].null_count() == 0
    val = records.filter(pl.col("phase") == "val")
    assert sorted(val["step"].unique()) == VALIDATED[run]

    protocol = json.loads((folder / "protocol.json").read_text())
    assert protocol["violations"] == 0
    assert protocol["train"]["episodes"] == steps * EPISODES_PER_STEP
    assert protocol["val"]["episodes"] == len(VALIDATED[run]) * VAL_EPISODES
    assert protocol["records"] == protocol["generations"] == protocol["calls"] == records.height

    metrics = pl.read_parquet(folder / "step_metrics.parquet")
    assert metrics["step"].to_list() == list(range(steps))
    assert set(VERL_METRICS + PROTOCOL_METRICS) <= set(metrics.columns)
    assert metrics["protocol/violations"].to_list() == [0.0] * steps
    assert metrics["protocol/episodes"].to_list() == [float(EPISODES_PER_STEP)] * steps
    assert metrics["rollout/logprob_gap_max"].max() < 1e-4  # replayed masks = sampling masks
    assert metrics["rollout/importance_ratio_outside"].to_list() == [0.0] * steps
    assert all(abs(r - 1) < 1e-5 for r in metrics["rollout/importance_ratio_mean"])
    # over the whole vocabulary the sampled tokens lose the mass the grammar forbade
    assert all(r < 0.999 for r in metrics["rollout/importance_ratio_raw_mean"])
    for source in ("gpqa", "lcb"):  # per-source scores agree with the records
        for step in range(steps):
            ep = (
                train.filter((pl.col("step") == step) & (pl.col("source") == source))
                .group_by("question_uid", "sample")
                .agg(pl.col("score").sum())
            )
            if ep.height:
                got = metrics.filter(pl.col("step") == step)[f"score/{source}/mean"].item()
                assert got == pytest.approx(ep["score"].mean())

    # Call advantages: the advantage at each record's action token, by step, turn and tool.
    calls = pl.read_parquet(folder / "call_advantages.parquet")
    expected = (
        train.group_by("step", "turn", "tool")
        .agg(
            pl.len().alias("n"), pl.col("advantage").mean().alias("adv"), pl.col("reward").mean().alias("rew")
        )
        .sort("step", "turn", "tool")
    )
    got = calls.sort("step", "turn", "tool")
    assert got["count"].to_list() == expected["n"].to_list()
    assert got["advantage_mean"].to_list() == pytest.approx(expected["adv"].to_list())
    assert got["reward_mean"].to_list() == pytest.approx(expected["rew"].to_list())

    curve = pl.read_parquet(folder / "validation.parquet")
    assert sorted(curve["step"].unique()) == VALIDATED[run]
    assert set(curve["source"]) == {"gpqa", "lcb", "all"}
    assert curve.filter(pl.col("source") == "all")["n"].to_list() == [VAL_EPISODES] * len(VALIDATED[run])

    # wandb, offline, under the run folder: the logged rows are the step metrics.
    (wandb_file,) = (folder / "wandb").rglob("*.wandb")
    history = {row["_step"]: row for row in read_history(wandb_file)}
    for row in metrics.iter_rows(named=True):
        logged = history[row["step"] + 1]
        for name in ("actor/pg_loss", "critic/vf_loss", "critic/score/mean", "protocol/violations"):
            assert logged[name] == pytest.approx(row[name], rel=1e-12)
    assert "val/all/utility" in history[0]


@pytest.mark.parametrize("run", RUNS)
def test_checkpoints_are_compact_listed_and_hashed(pipeline, run):
    index = json.loads((pipeline / "results/runs" / run / "checkpoints.json").read_text())
    assert [c["step"] for c in index["checkpoints"]] == list(range(1, RUNS[run] + 1))
    base = dict(AutoModelForCausalLM.from_pretrained(pipeline / "results/models/tiny").named_parameters())
    for c in index["checkpoints"]:
        folder = pipeline / c["path"]
        for name, entry in c["files"].items():
            assert sha256_file(folder / name) == entry["sha256"], folder / name
        for role in ("actor", "critic"):
            tensors = load_file(folder / f"{role}.safetensors")
            # Only LoRA tensors (and the critic's head): no base weight, and none of its shapes' worth.
            assert all(".lora_A." in n or ".lora_B." in n or n.startswith("value_head.") for n in tensors)
            assert all(f".{role}." in n for n in tensors if not n.startswith("value_head."))
            assert all(torch.isfinite(t).all() for t in tensors.values())
            assert sum(t.numel() for t in tensors.values()) < 0.1 * sum(p.numel() for p in base.values())
            # AdamW state (exp_avg, exp_avg_sq, step) for every trainable tensor: all were trained.
            optim = load_file(folder / f"optim_{role}.safetensors")
            assert sorted(optim) == sorted(
                f"{n}::{k}" for n in tensors for k in ("exp_avg", "exp_avg_sq", "step")
            )
        assert sorted(load_file(folder / "critic.safetensors"))[-2:] == [
            "value_head.bias",
            "value_head.weight",
        ]


def test_exported_actor_adapter_is_the_last_checkpoint(pipeline):
    folder = pipeline / "results/runs/zero_potential"
    last = load_file(pipeline / "results/checkpoints/zero_potential/step_2/actor.safetensors")
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(pipeline / "results/models/tiny"), folder / "adapters/actor"
    )
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(loaded) == len(last)
    for name, tensor in last.items():
        assert torch.equal(loaded[name.replace(".actor.", ".default.")], tensor), name


def test_arms_place_score_plus_shaping_on_action_tokens(pipeline):
    runs = pipeline / "results/runs"
    for run in ("training_smoke", "zero_potential"):  # zero potential: reward is the score
        r = pl.read_parquet(runs / run / "records.parquet").filter(pl.col("phase") == "train")
        assert (r["reward"] == r["score"]).all() and (r["potential_before"] == 0).all()

    info = json.loads((runs / "frozen_potential/run.json").read_text())
    assert info["snapshot"] == "results/checkpoints/training_smoke/step_2/critic.safetensors"
    r = pl.read_parquet(runs / "frozen_potential/records.parquet").filter(pl.col("phase") == "train")
    assert (r["potential_before"] != 0).all()
    # gamma = dose = 1: the shaping of an episode telescopes to -Phi(s_0).
    per_episode = (
        r.sort("turn")
        .group_by("step", "question_uid", "sample")
        .agg(
            (pl.col("reward") - pl.col("score")).sum().alias("shaping"),
            pl.col("potential_before").first().alias("phi0"),
        )
    )
    assert (per_episode["shaping"] + per_episode["phi0"]).abs().max() < 1e-9

    # Phi(s_k) is the snapshot critic's value after the token before generation k.
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(pipeline / "results/models/tiny"), CFG.training)
    snapshot = load_file(pipeline / info["snapshot"])
    with torch.no_grad():
        for name, p in ac.trainable("critic").items():
            p.copy_(snapshot[name])
    traj = pl.read_parquet(runs / "frozen_potential/trajectories.parquet").filter(
        (pl.col("phase") == "train") & (pl.col("step") == 0)
    )
    for row in traj.iter_rows(named=True):
        recs = r.filter(
            (pl.col("step") == 0)
            & (pl.col("question_uid") == row["question_uid"])
            & (pl.col("sample") == row["sample"])
        ).sort("turn")
        with torch.no_grad():
            values = ac.values(torch.tensor([row["token_ids"]]))[0]
        expected = [float(values[s - 1]) for s in recs["generation_start"]]
        assert recs["potential_before"].to_list() == pytest.approx(expected, abs=1e-5)


def test_dose_step_shaped_returns_differ_by_the_telescoped_potential(pipeline):
    folder = pipeline / "results/runs/dose_step"
    report = json.loads((folder / "dose_step.json").read_text())
    assert [d["dose"] for d in report["doses"]] == [0.0, 0.5, 1.0]
    zero = report["doses"][0]
    for d in report["doses"]:
        assert d["protocol"]["violations"] == 0
        assert d["max_abs_residual"] <= report["tolerance"] == 1e-9
        for ep, ep0 in zip(d["episodes"], zero["episodes"], strict=True):
            assert ep["shaped_return"] - ep0["shaped_return"] == pytest.approx(
                -d["dose"] * ep["phi_s0"], abs=1e-9
            )
    assert any(ep["phi_s0"] != 0 for ep in zero["episodes"])
    assert all(c["advantage_mean_change"] == 0 for c in zero["call_advantage"])
    records = pl.read_parquet(folder / "records.parquet")
    assert sorted(records["run"].unique()) == [
        "dose_step/dose=0.0",
        "dose_step/dose=0.5",
        "dose_step/dose=1.0",
    ]
    assert pl.read_parquet(folder / "step_metrics.parquet")["dose"].to_list() == [0.0, 0.5, 1.0]
