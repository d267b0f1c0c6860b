"""The failing paths of the checkpoint checks, on a tiny policy saved here: a record field such as
`all_finite` or `probe_logprobs_equal` is written as a literal once its check has passed, so what
guards it is that the check refuses every checkpoint that would make it false."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from atlas.checks.compact import base_parameter_names, compact_checkpoint_validation
from atlas.checks.roundtrip import metric_rel_tol, policy_roundtrip, probes, same_metrics
from atlas.config.training import TrainingConfig
from atlas.errors import CheckFailed
from atlas.model.policy import ROLES, ActorCritic
from atlas.rl.checkpoint import save_trainable

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
IDS = torch.tensor([[1, 50, 60, 70, 80, 90, 2], [1, 40, 41, 42, 43, 44, 2]])


def policy(tiny_model) -> ActorCritic:
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)
    # Trained-looking adapters: LoRA B starts at zero, so without this the adapters change nothing.
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for role in ROLES:
            for p in ac.trainable(role).values():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return ac


@pytest.fixture
def saved(tiny_model, tmp_path):
    folder = tmp_path / "step_1"
    folder.mkdir()
    save_trainable(folder, policy(tiny_model))
    base = {n for n, _ in AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters()}
    return folder, base


def fresh(tiny_model, second=None):
    """fresh_policy for policy_roundtrip: the first call gives the policy the checkpoint is loaded
    into; later calls (the reload after the save) get `second` applied."""
    calls = []

    def make() -> ActorCritic:
        ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)
        if calls and second is not None:
            second(ac)
        calls.append(ac)
        return ac

    make.calls = calls  # the policies made, for a test to probe after the check
    return make


def test_an_intact_checkpoint_passes_both_checks(tiny_model, saved):
    folder, base = saved
    rows = compact_checkpoint_validation(folder, base, step=1)
    assert [(r["role"], r["all_finite"], r["base_weights_present"]) for r in rows] == [
        ("actor", True, 0),
        ("critic", True, 0),
    ]
    record = policy_roundtrip(fresh(tiny_model), folder, 1, IDS)
    assert record["step"] == 1 and record["next_step_metrics_equal"] is None
    assert record["probe_logprobs_equal"] and record["probe_values_equal"]
    assert record["tensors_bit_equal"] == 2 * (2 * 7 * 2) + 2 and record["probe_tokens"] == IDS.numel()


def test_a_value_head_in_the_actor_file_is_named(saved):
    folder, base = saved
    path = folder / "actor.safetensors"
    tensors = load_file(path)
    tensors["value_head.weight"] = load_file(folder / "critic.safetensors")["value_head.weight"]
    save_file(tensors, path)
    with pytest.raises(
        CheckFailed, match=rf"{path}: tensor value_head.weight is the value head, which belongs"
    ):
        compact_checkpoint_validation(folder, base, step=1)


def test_an_unknown_tensor_counts_as_a_base_weight(saved):
    folder, base = saved
    path = folder / "critic.safetensors"
    save_file({**load_file(path), "model.norm.scale": torch.ones(4)}, path)
    with pytest.raises(CheckFailed, match=rf"{path}: tensor model.norm.scale is a base weight"):
        compact_checkpoint_validation(folder, base, step=1)


def test_a_non_finite_tensor_fails_the_roundtrip(tiny_model, saved):
    folder, _ = saved
    path = folder / "critic.safetensors"
    tensors = load_file(path)
    tensors["value_head.bias"][0] = float("inf")
    save_file(tensors, path)
    with pytest.raises(CheckFailed, match=rf"{path}: tensor value_head.bias has non-finite values"):
        policy_roundtrip(fresh(tiny_model), folder, 1, IDS)


def test_probes_that_change_after_the_reload_fail_the_roundtrip(tiny_model, saved):
    """The reloaded policy holds the file's tensors bit for bit, yet computes something else: a
    changed base weight moves both probes (the actor's is compared first), a changed critic
    adapter scale moves the values alone."""
    folder, _ = saved

    def base_moved(ac: ActorCritic) -> None:
        with torch.no_grad():
            next(p for n, p in ac.base_parameters() if "embed_tokens" in n).mul_(1.01)

    def critic_scale_moved(ac: ActorCritic) -> None:
        for module in ac.peft.modules():
            if isinstance(getattr(module, "scaling", None), dict) and "critic" in module.scaling:
                module.scaling["critic"] *= 2

    with pytest.raises(
        CheckFailed, match=rf"{folder}: actor_logprobs on the probe batch differ after a save/load"
    ):
        policy_roundtrip(fresh(tiny_model, base_moved), folder, 1, IDS)
    make = fresh(tiny_model, critic_scale_moved)
    with pytest.raises(
        CheckFailed, match=rf"{folder}: critic_values on the probe batch differ after a save/load"
    ) as err:
        policy_roundtrip(make, folder, 1, IDS)
    # the message gives the largest difference between the two policies' values
    loaded, reloaded = make.calls
    diff = (probes(loaded, IDS)["critic_values"] - probes(reloaded, IDS)["critic_values"]).abs().max().item()
    assert diff > 0 and str(err.value).endswith(f"(max {diff})")


def test_a_reload_that_rounds_the_tensors_fails_the_roundtrip(tiny_model, saved):
    """A policy reloaded in bf16 holds every saved tensor rounded: named before any probe runs."""
    folder, _ = saved
    with pytest.raises(
        CheckFailed, match=rf"{folder / 'actor.safetensors'}: tensor \S+ differs after loading it"
    ):
        policy_roundtrip(fresh(tiny_model, lambda ac: ac.to(torch.bfloat16)), folder, 1, IDS)


def test_resumed_metrics_must_match_exactly():
    logged = {"run": "arm", "step": 1, "actor/pg_loss": 0.25, "critic/vf_loss": 1.5, "timing_s/step": 3.0}
    assert (
        same_metrics({"actor/pg_loss": 0.25, "critic/vf_loss": 1.5, "timing_s/step": 9.9}, logged, "x") == 2
    )
    with pytest.raises(CheckFailed, match=r"x: metric critic/vf_loss is 1.5000000001 after resuming"):
        same_metrics({"actor/pg_loss": 0.25, "critic/vf_loss": 1.5000000001}, logged, "x")
    # A metric the logged step did not have (null in step_metrics.parquet) must stay absent.
    assert same_metrics({"score/gpqa/mean": 1.0}, {"score/gpqa/mean": 1.0, "score/lcb/mean": None}, "x") == 2
    with pytest.raises(
        CheckFailed, match=r"x: metric score/lcb/mean is 0.0 after resuming, the run had none"
    ):
        same_metrics({"score/lcb/mean": 0.0}, {"score/lcb/mean": None}, "x")


def test_resumed_metrics_on_a_gpu_match_within_the_tolerance_only(capsys):
    logged = {"step": 1, "critic/grad_norm": 10.587645530700684, "actor/kl": 0.0}
    # seen on an H200: the resumed step's grad norm 2e-7 relative off the logged one
    on_gpu = {"critic/grad_norm": 10.58764362335205, "actor/kl": 5e-9}
    with pytest.raises(CheckFailed, match="actor/kl is 5e-09"):  # on a CPU: equal, or refused
        same_metrics(on_gpu, logged, "x")
    assert same_metrics(on_gpu, logged, "x", rel_tol=1e-4) == 2
    # grad_norm used 1.8e-7 / 1e-4 of its tolerance, kl 5e-9 / 1e-6
    assert (
        "x: 2 metrics within rel_tol 0.0001, using at most 0.005 of it (actor/kl)" in capsys.readouterr().out
    )
    with pytest.raises(CheckFailed, match=r"metric critic/grad_norm is 10.6 after .* \(rel_tol 0.0001\)"):
        same_metrics({**on_gpu, "critic/grad_norm": 10.6}, logged, "x", rel_tol=1e-4)
    with pytest.raises(CheckFailed, match="metric actor/kl is 2e-06"):  # near 0: 1e-6 absolute
        same_metrics({**on_gpu, "actor/kl": 2e-6}, logged, "x", rel_tol=1e-4)
    # the gap between the rollout's and the update's log-probs moves with log-probs of order 1:
    # compared within 1e-4 absolute (the H200's resumed value and the logged one, 1.0e-6 apart)
    gap = {"rollout/logprob_gap_mean": 0.0013327865162864327, "rollout/logprob_gap_max": 0.0625}
    resumed = {"rollout/logprob_gap_mean": 0.0013337965356186032, "rollout/logprob_gap_max": 0.0625}
    assert same_metrics(resumed, gap, "x", rel_tol=1e-4) == 2
    with pytest.raises(CheckFailed, match="rollout/logprob_gap_mean is 0.0013337965356186032"):
        same_metrics(resumed, gap, "x")  # on a CPU: equal
    with pytest.raises(CheckFailed, match="rollout/logprob_gap_mean is 0.0015"):
        same_metrics({**resumed, "rollout/logprob_gap_mean": 0.0015}, gap, "x", rel_tol=1e-4)
    # every metric that differs is named, not only the first
    both = {**on_gpu, "critic/grad_norm": 10.6, "actor/kl": 2e-6}
    with pytest.raises(CheckFailed, match=r"x: metric actor/kl is 2e-06 .*; metric critic/grad_norm is 10.6"):
        same_metrics(both, logged, "x", rel_tol=1e-4)
    # the checks take the tolerance from the policy's device: exact on a CPU
    assert metric_rel_tol(torch.device("cpu")) == 0.0 and metric_rel_tol(torch.device("cuda", 0)) == 1e-4


def test_the_exported_actor_reproduces_its_checkpoint_and_no_other(tiny_model, tmp_path):
    from atlas.rl.checkpoint import export_adapters
    from atlas.stages.checks import exported_actor_reproduces

    ac = policy(tiny_model)
    export_adapters(ac, tmp_path / "adapters")
    assert exported_actor_reproduces(tiny_model, tmp_path / "adapters", ac, IDS) == 0.0
    with torch.no_grad():
        for p in ac.trainable("actor").values():
            p.add_(0.01)
    assert exported_actor_reproduces(tiny_model, tmp_path / "adapters", ac, IDS) > 1e-4


@pytest.mark.parametrize("tied", [True, False])
def test_base_parameter_names_come_from_the_config_alone(tiny_model, tmp_path, tied):
    """The names the checks compare a compact checkpoint against: those of the loaded base (tied
    weights once), read from config.json with no weight file present."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = tied
    full = tmp_path / "full"
    AutoModelForCausalLM.from_config(config).save_pretrained(full)
    loaded = {n for n, _ in AutoModelForCausalLM.from_pretrained(full).named_parameters()}
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((full / "config.json").read_bytes())
    assert base_parameter_names(config_only) == loaded == base_parameter_names(full)
    assert ("lm_head.weight" in loaded) is not tied
    assert "model.embed_tokens.weight" in loaded
