"""Checks of compact checkpoints: what they hold, that it is finite, that the optimizer covers it.

Each check returns its JSON record and raises CheckFailed, naming the file and the tensor, on
the first problem: a non-finite tensor, a base weight inside a compact checkpoint, a trainable
tensor without optimizer state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from atlas.errors import CheckFailed
from atlas.hashing import sha256_file
from atlas.model.policy import ROLES

ADAPTER = re.compile(r"\.(lora_[AB])\.[A-Za-z0-9_]+\.")
OPTIM_FIELDS = ("exp_avg", "exp_avg_sq", "step")


def base_name(name: str) -> str:
    """The base-model name a peft parameter wraps (LoRA parts stripped), for comparison."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def base_parameter_names(model_dir: Path) -> set[str]:
    """The parameter names of the base model in `model_dir`, as `named_parameters()` of the loaded
    model gives them (tied weights once), from its config alone: the model is built on the meta
    device, so no weight file is opened."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name for name, _ in model.named_parameters()}


def compact_checkpoint_validation(
    folder: Path, base_names: set[str], *, step: int, rank: int = 0
) -> list[dict]:
    """One record per role: trainable names, critic head keys, file sizes, finite checks, and
    proof that no base weight is present (every tensor is a LoRA factor or the value head, and
    none has a base model parameter's name)."""
    rows = []
    for role in ROLES:
        path = folder / f"{role}.safetensors"
        tensors = load_file(str(path))
        for name, t in sorted(tensors.items()):
            if not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise CheckFailed(f"{path}: tensor {name} has {bad} non-finite values")
            is_head = name.startswith("value_head.")
            if (not is_head and not ADAPTER.search(name)) or base_name(name) in base_names:
                raise CheckFailed(f"{path}: tensor {name} is a base weight; a compact checkpoint holds none")
            if is_head and role != "critic":
                raise CheckFailed(f"{path}: tensor {name} is the value head, which belongs to the critic")
        rows.append(
            {
                "step": step,
                "role": role,
                "rank": rank,
                "file": path.name,
                "bytes": path.stat().st_size,
                "tensors": len(tensors),
                "parameters": sum(t.numel() for t in tensors.values()),
                "trainable_names": sorted(tensors),
                "critic_head_keys": sorted(n for n in tensors if n.startswith("value_head.")),
                "all_finite": True,
                "base_weights_present": 0,
            }
        )
    return rows


def optimizer_counts(folder: Path) -> dict[str, dict[str, int]]:
    """Per role: trainable tensors and tensors with complete AdamW state; they must be equal."""
    out = {}
    for role in ROLES:
        tensors = load_file(str(folder / f"{role}.safetensors"))
        optim_path = folder / f"optim_{role}.safetensors"
        fields: dict[str, set[str]] = {}
        for key in load_file(str(optim_path)):
            name, _, field = key.rpartition("::")
            fields.setdefault(name, set()).add(field)
        for name in sorted(tensors):
            if fields.get(name, set()) != set(OPTIM_FIELDS):
                have = sorted(fields.get(name, set()))
                raise CheckFailed(
                    f"{optim_path}: optimizer state of {name} has {have}, expected {list(OPTIM_FIELDS)}"
                )
        stray = sorted(set(fields) - set(tensors))
        if stray:
            raise CheckFailed(
                f"{optim_path}: optimizer state for {stray[0]}, which is not a trainable tensor"
            )
        out[role] = {"trainable_tensors": len(tensors), "optimizer_states": len(fields)}
    return out


def verl_checkpoint_shards(index: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A verl run's own checkpoints (adapters/verl_checkpoints.json, from atlas.verl.convert): every
    file still has the sha256 recorded at conversion, and each role has a model shard. Per step,
    the shard count by kind (model, optim, extra_state) and role: verl keeps the optimizer there."""
    rows = []
    for c in index:
        kinds: dict[str, dict[str, int]] = {}
        for rel, entry in sorted(c["files"].items()):
            path = Path(c["path"]) / rel
            if not path.is_file():
                raise CheckFailed(f"{path}: missing; verl_checkpoints.json lists it")
            if (digest := sha256_file(path)) != entry["sha256"]:
                raise CheckFailed(
                    f"{path}: sha256 {digest}, verl_checkpoints.json recorded {entry['sha256']}"
                )
            role, _, name = rel.partition("/")
            kind = name.split("_world_size_")[0] if "_world_size_" in name else "other"
            kinds.setdefault(role, {}).setdefault(kind, 0)
            kinds[role][kind] += 1
        for role in ROLES:
            if not kinds.get(role, {}).get("model"):
                raise CheckFailed(f"{c['path']}/{role}: no model shard (model_world_size_<W>_rank_<r>.pt)")
        rows.append({"step": c["global_step"], "path": c["path"], "shards": kinds})
    return rows


def adapter_hashes(adapters: Path) -> dict[str, str]:
    return {
        p.relative_to(adapters).as_posix(): sha256_file(p) for p in sorted(adapters.rglob("*")) if p.is_file()
    }


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def verify_index(index: dict) -> None:
    """Every checkpoint file still has the bytes the run recorded in checkpoints.json."""
    for c in index["checkpoints"]:
        for name, entry in c["files"].items():
            path = Path(c["path"]) / name
            if not path.is_file():
                raise CheckFailed(f"{path}: missing; checkpoints.json lists it")
            if (digest := sha256_file(path)) != entry["sha256"]:
                raise CheckFailed(f"{path}: sha256 {digest}, checkpoints.json recorded {entry['sha256']}")
