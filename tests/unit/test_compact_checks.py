"""The compact-checkpoint checks on checkpoints written here tensor by tensor: the records they
return, and the file and tensor each refusal names. Digests are recomputed with hashlib."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from atlas.checks.compact import (
    adapter_hashes,
    base_parameter_names,
    compact_checkpoint_validation,
    optimizer_counts,
    read_json,
    verify_index,
    verl_checkpoint_shards,
)
from atlas.errors import CheckFailed

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
BASE = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"}


def lora() -> dict[str, torch.Tensor]:
    return {Q_A: torch.full((2, 4), 0.5), Q_B: torch.full((4, 2), -0.25)}


def write(folder: Path, actor: dict, critic: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(actor, str(folder / "actor.safetensors"))
    save_file(critic, str(folder / "critic.safetensors"))
    return folder


def checkpoint(tmp_path: Path) -> Path:
    head = {"value_head.weight": torch.ones(1, 4), "value_head.bias": torch.zeros(1)}
    return write(tmp_path / "step_3", lora(), {**lora(), **head})


def test_an_intact_checkpoint_gives_one_record_per_role(tmp_path):
    folder = checkpoint(tmp_path)
    actor_bytes = len((folder / "actor.safetensors").read_bytes())
    critic_bytes = len((folder / "critic.safetensors").read_bytes())
    assert compact_checkpoint_validation(folder, BASE, step=3, rank=1) == [
        {
            "step": 3,
            "role": "actor",
            "rank": 1,
            "file": "actor.safetensors",
            "bytes": actor_bytes,
            "tensors": 2,
            "parameters": 16,
            "trainable_names": [Q_A, Q_B],
            "critic_head_keys": [],
            "all_finite": True,
            "base_weights_present": 0,
        },
        {
            "step": 3,
            "role": "critic",
            "rank": 1,
            "file": "critic.safetensors",
            "bytes": critic_bytes,
            "tensors": 4,
            "parameters": 21,
            "trainable_names": sorted([Q_A, Q_B, "value_head.bias", "value_head.weight"]),
            "critic_head_keys": ["value_head.bias", "value_head.weight"],
            "all_finite": True,
            "base_weights_present": 0,
        },
    ]
    assert [r["rank"] for r in compact_checkpoint_validation(folder, BASE, step=3)] == [0, 0]


def test_the_first_non_finite_tensor_is_named_with_its_count(tmp_path):
    actor = lora()
    actor[Q_B][0, 0], actor[Q_B][3, 1] = float("nan"), float("-inf")
    actor[Q_A][1, 2] = float("inf")
    folder = write(tmp_path / "step_1", actor, lora())
    path = folder / "actor.safetensors"
    with pytest.raises(CheckFailed, match=f"^{re.escape(f'{path}: tensor {Q_A} has 1 non-finite values')}$"):
        compact_checkpoint_validation(folder, BASE, step=1)
    actor[Q_A][1, 2] = 0.0
    folder = write(tmp_path / "step_1", actor, lora())
    with pytest.raises(CheckFailed, match=f"^{re.escape(f'{path}: tensor {Q_B} has 2 non-finite values')}$"):
        compact_checkpoint_validation(folder, BASE, step=1)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("base_model.model.model.norm.weight", BASE),  # a base weight under peft's prefix
        ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", BASE),
        ("model.norm.weight", set()),  # not a LoRA factor: a base weight, named or not
        # A LoRA-looking name that the base model has is a base weight too.
        ("base_model.model.model.x.lora_A.default.weight", {"model.x.lora_A.default.weight"}),
        ("base_model.model.model.x.base_layer.lora_A.default.weight", {"model.x.lora_A.default.weight"}),
    ],
)
def test_a_base_weight_in_a_compact_checkpoint_is_named(tmp_path, name, base):
    folder = write(tmp_path / "step_1", lora(), {**lora(), name: torch.ones(2)})
    path = folder / "critic.safetensors"
    why = f"{path}: tensor {name} is a base weight; a compact checkpoint holds none"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        compact_checkpoint_validation(folder, base, step=1)


def test_the_value_head_belongs_to_the_critic(tmp_path):
    folder = write(tmp_path / "step_1", {**lora(), "value_head.weight": torch.ones(1, 4)}, lora())
    why = f"{folder / 'actor.safetensors'}: tensor value_head.weight is the value head, which belongs to the critic"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        compact_checkpoint_validation(folder, BASE, step=1)


def optimizer(folder: Path, role: str, names: list[str], fields=("exp_avg", "exp_avg_sq", "step")) -> None:
    state = {f"{n}::{f}": torch.zeros(1) for n in names for f in fields}
    save_file(state, str(folder / f"optim_{role}.safetensors"))


def test_every_trainable_tensor_has_its_adamw_state(tmp_path):
    folder = checkpoint(tmp_path)
    optimizer(folder, "actor", [Q_A, Q_B])
    optimizer(folder, "critic", [Q_A, Q_B, "value_head.weight", "value_head.bias"])
    assert optimizer_counts(folder) == {
        "actor": {"trainable_tensors": 2, "optimizer_states": 2},
        "critic": {"trainable_tensors": 4, "optimizer_states": 4},
    }
    path = folder / "optim_critic.safetensors"
    optimizer(folder, "critic", [Q_A, Q_B, "value_head.weight"])
    why = f"{path}: optimizer state of value_head.bias has [], expected ['exp_avg', 'exp_avg_sq', 'step']"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        optimizer_counts(folder)
    save_file(
        {
            f"{n}::{f}": torch.zeros(1)
            for n in [Q_A, Q_B, "value_head.weight", "value_head.bias"]
            for f in ("exp_avg", "step")
        },
        str(path),
    )
    why = f"{path}: optimizer state of {Q_A} has ['exp_avg', 'step'], expected ['exp_avg', 'exp_avg_sq', 'step']"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        optimizer_counts(folder)
    optimizer(folder, "critic", [Q_A, Q_B, "value_head.weight", "value_head.bias", "a::b", "z"])
    why = f"{path}: optimizer state for a::b, which is not a trainable tensor"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        optimizer_counts(folder)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verl_step(tmp_path: Path, g: int, files: list[str]) -> dict:
    folder = tmp_path / f"global_step_{g}"
    for n, rel in enumerate(files):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(f"{g}:{n}".encode())
    return {
        "global_step": g,
        "path": str(folder),
        "files": {rel: {"sha256": sha256(folder / rel)} for rel in files},
    }


def test_verl_checkpoints_are_counted_by_kind_and_role(tmp_path):
    two = [
        "actor/model_world_size_2_rank_0.pt",
        "actor/model_world_size_2_rank_1.pt",
        "actor/optim_world_size_2_rank_0.pt",
        "actor/optim_world_size_2_rank_1.pt",
        "actor/extra_state_world_size_2_rank_0.pt",
        "actor/huggingface/config.json",
        "critic/model_world_size_2_rank_0.pt",
    ]
    index = [
        verl_step(tmp_path, 2, two),
        verl_step(tmp_path, 4, ["actor/model_world_size_1_rank_0.pt", "critic/model_world_size_1_rank_0.pt"]),
    ]
    assert verl_checkpoint_shards(index) == [
        {
            "step": 2,
            "path": str(tmp_path / "global_step_2"),
            "shards": {
                "actor": {"model": 2, "optim": 2, "extra_state": 1, "other": 1},
                "critic": {"model": 1},
            },
        },
        {
            "step": 4,
            "path": str(tmp_path / "global_step_4"),
            "shards": {"actor": {"model": 1}, "critic": {"model": 1}},
        },
    ]


def test_a_verl_checkpoint_changed_missing_or_without_a_model_shard_is_named(tmp_path):
    index = [
        verl_step(tmp_path, 1, ["actor/model_world_size_1_rank_0.pt", "critic/model_world_size_1_rank_0.pt"])
    ]
    shard = tmp_path / "global_step_1" / "critic" / "model_world_size_1_rank_0.pt"
    recorded = index[0]["files"]["critic/model_world_size_1_rank_0.pt"]["sha256"]
    shard.write_bytes(b"1:9")  # same size, other bytes
    why = f"{shard}: sha256 {sha256(shard)}, verl_checkpoints.json recorded {recorded}"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        verl_checkpoint_shards(index)
    shard.unlink()
    with pytest.raises(
        CheckFailed, match=f"^{re.escape(f'{shard}: missing; verl_checkpoints.json lists it')}$"
    ):
        verl_checkpoint_shards(index)
    index = [
        verl_step(tmp_path, 5, ["actor/model_world_size_1_rank_0.pt", "critic/optim_world_size_1_rank_0.pt"])
    ]
    why = f"{tmp_path / 'global_step_5'}/critic: no model shard (model_world_size_<W>_rank_<r>.pt)"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        verl_checkpoint_shards(index)


def test_exported_adapters_are_listed_with_their_sha256(tmp_path):
    adapters = tmp_path / "adapters"
    (adapters / "critic").mkdir(parents=True)
    (adapters / "adapter_config.json").write_text("{}")
    (adapters / "critic" / "adapter_model.safetensors").write_bytes(b"\x00\x01")
    assert adapter_hashes(adapters) == {
        "adapter_config.json": hashlib.sha256(b"{}").hexdigest(),
        "critic/adapter_model.safetensors": hashlib.sha256(b"\x00\x01").hexdigest(),
    }


def test_the_run_index_must_still_match_the_checkpoint_files(tmp_path):
    folder = checkpoint(tmp_path)
    files = {name: {"sha256": sha256(folder / name)} for name in ("actor.safetensors", "critic.safetensors")}
    index = {"checkpoints": [{"path": str(folder), "files": files}]}
    assert verify_index(index) is None
    actor = folder / "actor.safetensors"
    data = bytearray(actor.read_bytes())
    data[-1] ^= 1
    actor.write_bytes(bytes(data))
    why = f"{actor}: sha256 {sha256(actor)}, checkpoints.json recorded {files['actor.safetensors']['sha256']}"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        verify_index(index)
    actor.unlink()
    with pytest.raises(CheckFailed, match=f"^{re.escape(f'{actor}: missing; checkpoints.json lists it')}$"):
        verify_index(index)


@pytest.mark.parametrize("tied", [True, False])
def test_base_parameter_names_are_read_from_config_json_alone(tmp_path, tied):
    config = {
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 32,
        "tie_word_embeddings": tied,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    layer = "model.layers.0."
    names = {
        "model.embed_tokens.weight",
        *(f"{layer}self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"{layer}mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        f"{layer}input_layernorm.weight",
        f"{layer}post_attention_layernorm.weight",
        "model.norm.weight",
    }
    assert base_parameter_names(tmp_path) == (names if tied else names | {"lm_head.weight"})


def test_a_verl_checkpoint_without_a_role_has_no_model_shard_for_it(tmp_path):
    index = [verl_step(tmp_path, 6, ["actor/model_world_size_1_rank_0.pt"])]
    why = f"{tmp_path / 'global_step_6'}/critic: no model shard (model_world_size_<W>_rank_<r>.pt)"
    with pytest.raises(CheckFailed, match=f"^{re.escape(why)}$"):
        verl_checkpoint_shards(index)


def test_json_records_are_read_as_utf_8(tmp_path):
    path = tmp_path / "index.json"
    path.write_bytes('{"name": "café"}'.encode())
    assert read_json(path) == {"name": "café"}
