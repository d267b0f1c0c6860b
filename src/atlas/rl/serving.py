"""The trainer's policy on its device, and the model its rollouts sample from.

    ac, tokenizer = build_policy(model_dir, training, seed, device)   # actor-critic LoRA on the base
    rt, merged = rollout_runtime(ac, tokenizer, training, runtime, device)
    ...update...; merged.refresh()                                    # before each rollout

Training (atlas.rl.step), the dose step, the checks and the benchmarks build the policy and its
rollout runtime here, so they sample exactly as the trainer does. Nothing here reads or writes run
folders (no polars): a GPU benchmark imports it with torch, transformers, peft and xgrammar only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from atlas.config.runtime import RuntimeConfig
from atlas.config.training import TrainingConfig
from atlas.model.liger import apply_liger, wanted
from atlas.model.merged import MergedModel
from atlas.model.policy import ActorCritic
from atlas.runtime.session import Runtime, load_model, make_runtime


def build_policy(model_dir: Path, training: TrainingConfig, seed: int, device: str):
    """The actor-critic on the base model, with gradient checkpointing and Liger kernels when the
    config asks for them (both act in the updates: transformers recomputes layers in training
    mode, and rollouts sample from their own model, see rollout_model)."""
    base, tokenizer = load_model(model_dir, device)
    return policy_on(base, training, seed, device), tokenizer


def policy_on(base, training: TrainingConfig, seed: int, device: str) -> ActorCritic:
    """build_policy over a base model already in memory (the benchmarks' shapes)."""
    ac = ActorCritic(base, training, seed=seed).to(device)
    cuda = torch.device(device).type == "cuda"
    if training.ppo.on_gpu("gradient_checkpointing", cuda):
        ac.peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if wanted(training.ppo.liger, cuda):
        apply_liger(ac.peft)
    return ac


def rollout_model(ac: ActorCritic, training: TrainingConfig, device: str) -> MergedModel | None:
    """The merged serving copy of the actor (training.merged_rollouts), or None: sample through
    the adapters. With Liger (training.ppo.liger) the copy gets the policy's kernels too."""
    setting = training.merged_rollouts
    cuda = torch.device(device).type == "cuda"
    if not (cuda if setting == "auto" else setting):
        return None
    merged = MergedModel(ac.peft, "actor")
    if wanted(training.ppo.liger, cuda):  # the policy's fused norms, SwiGLU and RoPE: fewer kernels a step
        apply_liger(merged.model)
    return merged


def rollout_runtime(
    ac: ActorCritic, tokenizer, training: TrainingConfig, runtime: RuntimeConfig, device: str
) -> tuple[Runtime, MergedModel | None]:
    """The runtime rollouts sample through, and the merged serving copy it samples from (None:
    through the adapters), as rollout_model chooses."""
    merged = rollout_model(ac, training, device)
    return make_runtime(ac.peft if merged is None else merged.model, tokenizer, runtime), merged
