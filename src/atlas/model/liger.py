"""Liger's Triton kernels in the policy's update: RMSNorm, SwiGLU and RoPE (`training.ppo.liger`).

liger-kernel (the `gpu` extra) replaces a Qwen3 model's norm and MLP modules' forwards with fused
Triton kernels (fewer activation bytes and launches, in the forward and in the checkpoint
recompute) and swaps the module-level `apply_rotary_pos_emb` of transformers' Qwen3 code.

`apply_liger(model)` patches the norm and MLP instances of this one model only: liger's own entry
point also replaces the module-level classes (every model built afterwards would get them too),
so those are restored right away. The policy gets them (atlas.rl.serving.policy_on), and so does
the merged serving copy the rollouts sample from (rollout_model): in a decode step they replace
about 36 small kernels a layer. RoPE is a module-level function shared by every Qwen3 instance, so
it is swapped only for the duration of `liger_rope(model)`: the update's forward and backward
passes, and a rollout engine's generate call over a model with Liger. Not its loss kernels: the
output head is atlas.rl.fused_head's.
"""

from __future__ import annotations

import contextlib
import importlib.util

from atlas.errors import InputError

MARK = "_atlas_liger"


def available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def wanted(setting: bool | str, cuda: bool) -> bool:
    """`training.ppo.liger` resolved: auto is on with a GPU and liger-kernel installed; true
    without liger-kernel or without a GPU (its kernels are Triton's) is an error."""
    if setting == "auto":
        return cuda and available()
    if setting and not available():
        raise InputError("training.ppo.liger: true needs liger-kernel (pip install 'atlas[gpu]')")
    if setting and not cuda:
        raise InputError("training.ppo.liger: true needs resources.device: cuda (Triton kernels)")
    return bool(setting)


def _inner(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def apply_liger(model) -> None:
    """Liger RMSNorm and SwiGLU in this Qwen3 model's (or peft model's) layers."""
    from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    from transformers.models.qwen3 import modeling_qwen3

    inner = _inner(model)
    if inner.config.model_type != "qwen3":
        raise InputError(f"training.ppo.liger: Qwen3 models only (got {inner.config.model_type!r})")
    kept = {k: getattr(modeling_qwen3, k) for k in ("Qwen3RMSNorm", "Qwen3MLP", "apply_rotary_pos_emb")}
    try:
        apply_liger_kernel_to_qwen3(
            rope=False,
            rms_norm=True,
            swiglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
            model=inner,
        )
    finally:
        for k, v in kept.items():
            setattr(modeling_qwen3, k, v)
    setattr(inner, MARK, True)


def applied(model) -> bool:
    return getattr(_inner(model), MARK, False)


@contextlib.contextmanager
def liger_rope(model):
    """Liger's RoPE in transformers' Qwen3 attention for the block, when `model` has Liger."""
    if not applied(model):
        yield
        return
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    from transformers.models.qwen3 import modeling_qwen3

    before = modeling_qwen3.apply_rotary_pos_emb
    modeling_qwen3.apply_rotary_pos_emb = liger_rotary_pos_emb
    try:
        yield
    finally:
        modeling_qwen3.apply_rotary_pos_emb = before
