"""The validation stage's tensor digests: the raw bytes of any dtype the base model is held in,
and the base-tensor probes of a policy loaded in another dtype than its model file's."""

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atlas.checks.compact import CheckFailed
from atlas.stages.validation import PROBED, base_tensor_probes, tensor_sha


def test_a_bf16_tensor_digest_is_its_raw_bytes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    assert tensor_sha(t) == hashlib.sha256(t.view(torch.int16).numpy().tobytes()).hexdigest()
    bumped = t.clone()
    bumped[2, 3] = 100.0
    assert tensor_sha(bumped) != tensor_sha(t)
    f = torch.arange(6, dtype=torch.float32)
    assert tensor_sha(f) == hashlib.sha256(f.numpy().tobytes()).hexdigest()


def _base(dtype: torch.dtype, folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """A float32 model file holding the PROBED tensors (and one more), and the policy's base
    parameters loaded from it in `dtype` (as a GPU loads them: bf16), under peft's names (a
    LoRA-wrapped q_proj is a base_layer)."""
    g = torch.Generator().manual_seed(0)
    on_disk = {name: torch.randn(4, 8, generator=g) for name in (*PROBED, "lm_head.weight")}
    save_file(on_disk, str(folder / "model.safetensors"))
    live = {
        "base_model.model.model.embed_tokens.weight": on_disk["model.embed_tokens.weight"].to(dtype),
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight": on_disk[
            "model.layers.0.self_attn.q_proj.weight"
        ].to(dtype),
        "base_model.model.model.norm.weight": on_disk["model.norm.weight"].to(dtype),
    }
    return live, folder / "model.safetensors"


def test_base_tensors_loaded_in_bf16_from_a_float32_file_are_unchanged(tmp_path):
    for dtype in (torch.float32, torch.bfloat16):
        live, model_file = _base(dtype, tmp_path)
        probes = base_tensor_probes(live, model_file)
        assert set(probes) == set(PROBED)
        on_disk = load_file(str(model_file))
        assert all(p["live"] == p["file"] == tensor_sha(on_disk[n].to(dtype)) for n, p in probes.items())


def test_a_base_tensor_that_moved_is_named(tmp_path):
    live, model_file = _base(torch.bfloat16, tmp_path)
    live["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"][1, 2] += 1.0
    with pytest.raises(CheckFailed, match=rf"{model_file}: base tensor model.layers.0.self_attn.q_proj"):
        base_tensor_probes(live, model_file)
