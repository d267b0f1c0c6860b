"""The checks stage's records (from the `pipeline` fixture's real run) and the failures each check
exists to catch, triggered on purpose on copies of real checkpoints."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from atlas.checks.compact import CheckFailed, compact_checkpoint_validation, optimizer_counts, verify_index
from atlas.checks.roundtrip import batch_math
from atlas.config.study import config_slice
from atlas.hashing import verify
from conftest import suite_config

CFG = suite_config()  # the pipeline run's config
RUNS = {"training_smoke": 2, "zero_potential": 2, "frozen_potential": 2}  # steps
COMPACT_KEYS = {
    "step",
    "role",
    "rank",
    "file",
    "bytes",
    "tensors",
    "parameters",
    "trainable_names",
    "critic_head_keys",
    "all_finite",
    "base_weights_present",
}
ROUNDTRIP_KEYS = {
    "step",
    "checkpoint",
    "tensors_bit_equal",
    "all_finite",
    "probe_rows",
    "probe_tokens",
    "probe_logprobs_equal",
    "probe_values_equal",
    "next_step_metrics_equal",
    "next_step_metrics_rel_tol",
}
BATCH_KEYS = {
    "step",
    "questions",
    "responses_per_question",
    "trajectories",
    "generations",
    "tokens",
    "sampled_tokens",
    "epochs",
    "mini_batches",
    "trajectories_per_mini_batch",
    "micro_batches",
    "micro_batch_size",
    "optimizer_steps_per_role",
}


@pytest.mark.parametrize("run", RUNS)
def test_checks_records(pipeline, run, monkeypatch):
    monkeypatch.chdir(pipeline)
    folder = pipeline / "results/checks" / run
    assert verify(folder) == []
    steps = RUNS[run]

    compact = json.loads((folder / "compact_checkpoint_validation.json").read_text())["rows"]
    assert [(r["step"], r["role"]) for r in compact] == [
        (k, role) for k in range(1, steps + 1) for role in ("actor", "critic")
    ]
    for r in compact:
        assert set(r) == COMPACT_KEYS
        # all_finite and base_weights_present are written once the check passed: what guards
        # them is the check refusing a bad file (the tests below and tests/unit/test_check_failures.py).
        assert r["rank"] == 0
        assert r["critic_head_keys"] == (
            ["value_head.bias", "value_head.weight"] if r["role"] == "critic" else []
        )
        assert r["tensors"] == len(r["trainable_names"]) == 2 * 7 * 2 + len(r["critic_head_keys"])

    validation = json.loads((folder / "checkpoint_validation.json").read_text())
    for row in validation["optimizer_counts"]:
        for role in ("actor", "critic"):
            assert row[role]["optimizer_states"] == row[role]["trainable_tensors"] > 0
    assert validation["exported_actor_logprob_max_abs_diff"] == 0.0
    assert {"actor/adapter_model.safetensors", "critic/value_head.safetensors"} <= set(
        validation["exported_adapters"]
    )

    cpu = json.loads((folder / "cpu_roundtrip.json").read_text())
    roundtrip = cpu["checkpoints"]
    assert cpu["resumed_steps"] == CFG.checks.resumed_steps == 1  # the suite config's
    assert [r["step"] for r in roundtrip] == list(range(1, steps + 1))
    for r in roundtrip:
        # probe_*_equal are written once the roundtrip passed; tests/unit/test_check_failures.py
        # makes the roundtrip fail on changed probes, rounded and non-finite tensors.
        assert set(r) == ROUNDTRIP_KEYS and r["tensors_bit_equal"] == 2 * (2 * 7 * 2) + 2
        if r["step"] == 1:  # the first checkpoint is resumed from: every computed metric of step 1
            assert r["next_step_metrics_equal"] > 40 and r["next_step_metrics_rel_tol"] == 0.0  # a CPU: equal
        else:
            assert r["next_step_metrics_equal"] is None and r["next_step_metrics_rel_tol"] is None

    batches = json.loads((folder / "batch_math.json").read_text())["steps"]
    assert len(batches) == steps
    for b in batches:
        assert set(b) == BATCH_KEYS
        assert (b["questions"], b["trajectories"]) == (CFG.schedule.questions_per_step, 4)
        assert b["micro_batches"] == 1 and b["optimizer_steps_per_role"] == 1

    timing = json.loads((folder / "timing_analysis.json").read_text())
    assert [t["step"] for t in timing["steps"]] == list(range(steps))
    assert all(t["timing_s/step"] > 0 and t["perf/cpu_memory_used_gb"] > 0 for t in timing["steps"])
    for t in timing["steps"]:  # sampled while training: at least one reading a step
        assert t["sampled"]["samples"] >= 1 and t["sampled"]["rss_gb_max"] > 0.1
        assert (
            t["sampled"]["cpu_utilization_pct_mean"] > 0 and t["sampled"]["gpu_utilization_pct_mean"] is None
        )


@pytest.fixture
def checkpoint(pipeline, tmp_path):
    """A copy of a real compact checkpoint to break, and the base model's parameter names."""
    folder = shutil.copytree(pipeline / "results/checkpoints/zero_potential/step_2", tmp_path / "step_2")
    base = AutoModelForCausalLM.from_pretrained(pipeline / "results/models/tiny")
    return folder, {n for n, _ in base.named_parameters()}


def test_a_corrupted_tensor_is_named(checkpoint):
    folder, base = checkpoint
    assert len(compact_checkpoint_validation(folder, base, step=2)) == 2  # intact: passes
    path = folder / "critic.safetensors"
    tensors = load_file(path)
    name = sorted(n for n in tensors if "lora_B" in n)[3]
    tensors[name][0, 0] = float("nan")
    save_file(tensors, path)
    with pytest.raises(CheckFailed, match=rf"{path}: tensor {name} has 1 non-finite values"):
        compact_checkpoint_validation(folder, base, step=2)


def test_a_base_weight_in_a_checkpoint_is_named(checkpoint, pipeline):
    folder, base = checkpoint
    path = folder / "actor.safetensors"
    tensors = load_file(path)
    model = AutoModelForCausalLM.from_pretrained(pipeline / "results/models/tiny")
    slipped = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    tensors[slipped] = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    save_file(tensors, path)
    with pytest.raises(CheckFailed, match=rf"{path}: tensor {slipped} is a base weight"):
        compact_checkpoint_validation(folder, base, step=2)


def test_a_missing_optimizer_state_is_named(checkpoint):
    folder, _ = checkpoint
    assert optimizer_counts(folder)["actor"]["optimizer_states"] == 28
    path = folder / "optim_actor.safetensors"
    state = load_file(path)
    victim = sorted(state)[10].rpartition("::")[0]
    save_file({k: v for k, v in state.items() if not k.startswith(victim + "::")}, path)
    with pytest.raises(CheckFailed, match=rf"{path}: optimizer state of {victim} has \[\]"):
        optimizer_counts(folder)


def test_a_changed_checkpoint_file_is_named(pipeline, tmp_path):
    index = json.loads((pipeline / "results/runs/zero_potential/checkpoints.json").read_text())
    for c in index["checkpoints"]:
        c["path"] = str(pipeline / c["path"])
    verify_index(index)  # intact
    target = tmp_path / "step_1"
    shutil.copytree(index["checkpoints"][0]["path"], target)
    index["checkpoints"][0]["path"] = str(target)
    t = load_file(target / "actor.safetensors")
    first = sorted(t)[0]
    t[first] = t[first] + 1e-3
    save_file(t, target / "actor.safetensors")
    with pytest.raises(
        CheckFailed, match=rf"{target / 'actor.safetensors'}: sha256 [0-9a-f]+, checkpoints.json"
    ):
        verify_index(index)


def test_a_batch_size_mismatch_is_named(pipeline):
    folder = pipeline / "results/runs/zero_potential"
    records = pq.read_table(folder / "records.parquet").to_pylist()
    trajectories = pq.read_table(folder / "trajectories.parquet").to_pylist()
    kwargs = {"steps": 2, "questions": 2, "ppo": CFG.training.ppo}
    assert len(batch_math(records, trajectories, responses=2, **kwargs)) == 2
    with pytest.raises(CheckFailed, match=r"batch_math: step 0: 4 trajectories, the config says 2 x 3 = 6"):
        batch_math(records, trajectories, responses=3, **kwargs)
    dropped = [t for t in trajectories if not (t["step"] == 1 and t["sample"] == 1 and t["phase"] == "train")]
    with pytest.raises(CheckFailed, match=r"batch_math: step 1: 2 trajectories, the config says 2 x 2 = 4"):
        batch_math(records, dropped, responses=2, **kwargs)


DISTRIBUTED_KEYS = {
    "rank",
    "world_size",
    "backend",
    "device",
    "checkpoint",
    "step",
    "batch_rows",
    "rows_on_this_rank",
    "tokens",
    "loaded_tensors_equal",
    "grad_max_abs_diff_vs_single_process",
    "tolerance",
    "grads_within_tolerance",
    "tensors_out_of_tolerance",
    "parameter_digest",
    "digests_agree_across_ranks",
    "diverged_tensors",
}


@pytest.mark.parametrize("run", RUNS)
def test_distributed_roundtrip_records(pipeline, run):
    ranks = [
        json.loads((pipeline / f"results/checks/{run}/distributed_roundtrip_rank_{r}.json").read_text())
        for r in (0, 1)
    ]
    for r, rec in enumerate(ranks):
        assert set(rec) == DISTRIBUTED_KEYS
        assert (rec["rank"], rec["world_size"], rec["backend"], rec["step"]) == (r, 2, "gloo", RUNS[run])
        assert (
            rec["loaded_tensors_equal"]
            and rec["grads_within_tolerance"]
            and rec["digests_agree_across_ranks"]
        )
        assert rec["rows_on_this_rank"] * 2 == rec["batch_rows"] == 4
        assert rec["grad_max_abs_diff_vs_single_process"] < 1e-4
    assert ranks[0]["parameter_digest"] == ranks[1]["parameter_digest"]


def test_a_diverging_rank_is_named(pipeline, tmp_path):
    sl = json.dumps(config_slice(CFG, "distributed_roundtrip"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "atlas.stages.distributed_roundtrip", "--config-slice", sl]
    cmd += ["--model", "results/models/tiny", "--run-folder", "results/runs/zero_potential"]
    cmd += ["--out", str(tmp_path)]
    proc = subprocess.run(
        [*cmd, "--perturb-rank", "1"], cwd=pipeline, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert re.search(
        r"error: rank [01]: gradient of \S+lora_\S+\.actor\.weight differs from the single-process step",
        proc.stderr,
    )
    rec = json.loads((tmp_path / "distributed_roundtrip_rank_1.json").read_text())
    assert not rec["grads_within_tolerance"] and rec["tensors_out_of_tolerance"]


@pytest.mark.parametrize("policy", CFG.validation.policies)
def test_full_validation_of_each_policy(pipeline, policy, monkeypatch):
    monkeypatch.chdir(pipeline)
    folder = pipeline / "results/validation" / policy
    assert verify(folder) == []
    val = pq.read_table(pipeline / "results/data/val.parquet").num_rows
    summary = json.loads((folder / "validation.json").read_text())
    assert set(summary) == {
        "policy",
        "trajectories",
        "completed",
        "protocol",
        "by_source",
        "weight_probes",
        "software",
    }
    assert summary["trajectories"] == summary["completed"] == val * CFG.validation.samples
    assert summary["protocol"]["violations"] == 0 and summary["protocol"]["episodes"] == val
    assert {r["source"] for r in summary["by_source"]} == {"gpqa", "lcb", "all"}
    for probe in summary["weight_probes"]["base_tensors"].values():
        assert probe["live"] == probe["file"]
    if policy == "base":
        assert "lora_tensors_changed" not in summary["weight_probes"]
    else:
        changed = summary["weight_probes"]["lora_tensors_changed"]
        assert 0 < changed["changed"] <= changed["of"] == 2 * 7 * 2
    assert {
        "python",
        "torch",
        "transformers",
        "peft",
        "xgrammar",
        "snakemake",
        "polars",
        "cuda",
        "device",
    } <= set(summary["software"])
    answers = pq.read_table(folder / "answers.parquet").to_pylist()
    assert len(answers) == val and all(a["completed"] and a["final_answer"] for a in answers)
    records = pq.read_table(folder / "records.parquet").to_pylist()
    assert {r["phase"] for r in records} == {"val"}
