"""verl's LoRA-only checkpoints, saved by verl 0.9.1's own checkpoint managers from FSDP2 models on a
one-rank CPU mesh, read back as this project's policy: the actor's logits and the critic's values
of the converted tensors in an ActorCritic equal verl's models'. Runs in the verl venv (CI)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
if not os.environ.get("ATLAS_REQUIRE_VERL"):
    pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")

from safetensors.torch import load_file  # noqa: E402
from test_verl_critic import (  # noqa: E402, F401  (fixtures)
    batch,
    engine_for_lora_build,
    fsdp2,
    model_config,
    process_group,
    trained_critic,
    values,
)
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.trainer.config import CheckpointConfig  # noqa: E402
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager  # noqa: E402
from verl.workers.config import FSDPOptimizerConfig  # noqa: E402
from verl.workers.config.optimizer import build_optimizer  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine  # noqa: E402

from atlas.config.training import TrainingConfig  # noqa: E402
from atlas.model.policy import ActorCritic  # noqa: E402
from atlas.verl import critic  # noqa: E402
from atlas.verl.export import VerlCheckpointError, merged_state_dict, policy_tensors, write_policy_checkpoint  # noqa: E402


def trained_actor(model_config, input_ids):  # noqa: F811
    """verl's actor: its own LoRA build (CAUSAL_LM works for a causal LM), FSDP2, two LM steps."""
    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(
        model_config.local_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    model = fsdp2(engine_for_lora_build(FSDPEngine, model_config)._build_lora_module(base))
    optimizer = build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-2, total_training_steps=4))
    for _ in range(2):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


def test_verl_checkpoint_becomes_our_policy(process_group, model_config, tmp_path):  # noqa: F811
    ids = batch()
    actor, actor_opt = trained_actor(model_config, ids)
    value_model, critic_opt = trained_critic(model_config, seed=0, input_ids=ids)
    step = tmp_path / "global_step_1"
    lora_only = CheckpointConfig(save_lora_only=True)
    FSDPCheckpointManager(actor, actor_opt, checkpoint_config=lora_only).save_checkpoint(
        str(step / "actor"), global_step=1
    )
    critic.CriticCheckpointManager(value_model, critic_opt, checkpoint_config=lora_only).save_checkpoint(
        str(step / "critic"), global_step=1
    )

    write_policy_checkpoint(
        step, tmp_path / "step_1", {"stage": "verl_checkpoint", "config": {"global_step": 1}}
    )
    training = TrainingConfig(responses_per_question=1, lora_rank=8, lora_alpha=16, lora_targets="all-linear")
    base = AutoModelForCausalLM.from_pretrained(
        model_config.local_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    ac = ActorCritic(base, training, seed=7)
    for role in ("actor", "critic"):
        tensors = load_file(str(tmp_path / "step_1" / f"{role}.safetensors"))
        assert set(tensors) == set(ac.trainable(role))  # every trainable tensor, nothing else
        with torch.no_grad():
            for name, p in ac.trainable(role).items():
                p.copy_(tensors[name])
    with torch.no_grad():
        torch.testing.assert_close(ac.actor_logits(ids), actor(input_ids=ids).logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(ac.values(ids), values(value_model, ids), rtol=0, atol=1e-5)
    assert (tmp_path / "step_1" / "MANIFEST.json").is_file()

    # A critic saved without our checkpoint manager has no head: refused, not exported half-way.
    FSDPCheckpointManager(value_model, critic_opt, checkpoint_config=lora_only).save_checkpoint(
        str(tmp_path / "plain" / "critic"), global_step=1
    )
    with pytest.raises(VerlCheckpointError, match="no value head"):
        policy_tensors(merged_state_dict(tmp_path / "plain" / "critic"), "critic")
    (tmp_path / "plain" / "critic" / "model_world_size_2_rank_1.pt").write_bytes(b"")
    with pytest.raises(VerlCheckpointError, match="one world size"):
        merged_state_dict(tmp_path / "plain" / "critic")
