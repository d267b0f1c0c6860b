"""verl's LoRA-only checkpoints -> this project's policy tensors, so later stages read a verl run.

verl 0.9.1 saves, per role and rank, `global_step_<g>/<role>/model_world_size_<W>_rank_<r>.pt`:
the FSDP2 state dict of the peft model, filtered to LoRA keys (`save_lora_only`; the critic's value
head added by atlas.verl.critic), each tensor a DTensor shard. Here the W files are read without a
process group, each DTensor's local shards are joined along their Shard(d) dimension, and the keys
become `ActorCritic.trainable(role)` names:

    verl (peft adapter "default")                               atlas (adapters "actor", "critic")
    base_model.model.<module>.lora_A.default.weight             base_model.model.<module>.lora_A.<role>.weight
    base_model.model.score.modules_to_save.default.{weight,bias}   value_head.{weight,bias}  (critic)

The critic is a token classifier on the same base, so its LoRA lands on the same modules as ours;
its `score` head is our `value_head`. `write_policy_checkpoint` writes `actor.safetensors` and
`critic.safetensors` (the files the validation stage reads from a compact checkpoint) with a
MANIFEST.json.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from atlas.hashing import atomic_dir, write_manifest

_RANK_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")
_HEAD = re.compile(r"(?:^|\.)score\.modules_to_save\.default\.(weight|bias)$")


class VerlCheckpointError(ValueError):
    """A verl checkpoint folder that cannot be turned into policy tensors."""


def rank_files(folder: Path) -> list[Path]:
    """The folder's model files, rank 0 first; every rank of one world size must be there."""
    found = {}
    for path in folder.glob("model_world_size_*_rank_*.pt"):
        world, rank = map(int, _RANK_FILE.search(path.name).groups())
        found.setdefault(world, {})[rank] = path
    if len(found) != 1:
        raise VerlCheckpointError(f"{folder}: expected model files of one world size, found {sorted(found)}")
    ((world, files),) = found.items()
    missing = sorted(set(range(world)) - set(files))
    if missing:
        raise VerlCheckpointError(f"{folder}: world size {world} but no model file for ranks {missing}")
    return [files[r] for r in range(world)]


def merged_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """One full tensor per key from the ranks' shards (DTensor Shard(d) joined along d; a
    replicated or plain tensor taken from rank 0)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    shards = [torch.load(p, map_location="cpu", weights_only=False) for p in rank_files(folder)]
    out = {}
    for key, first in shards[0].items():
        if not isinstance(first, DTensor):
            out[key] = first
            continue
        (placement,) = first.placements  # verl's FSDP2 mesh has one dimension
        if isinstance(placement, Replicate):
            out[key] = first.to_local()
        elif isinstance(placement, Shard):
            out[key] = torch.cat([s[key].to_local() for s in shards], dim=placement.dim)
        else:
            raise VerlCheckpointError(
                f"{folder}: {key} has placement {placement}; expected Shard or Replicate"
            )
        if tuple(out[key].shape) != tuple(first.shape):
            raise VerlCheckpointError(
                f"{folder}: {key} joins to {tuple(out[key].shape)}, expected {tuple(first.shape)}"
            )
    return out


def policy_tensors(state: dict[str, torch.Tensor], role: str) -> dict[str, torch.Tensor]:
    """verl's LoRA (and, for the critic, head) keys as ActorCritic.trainable(role) names."""
    out = {}
    for key, tensor in state.items():
        if m := _HEAD.search(key):
            if role != "critic":
                raise VerlCheckpointError(f"{key}: a value head in the {role}'s checkpoint")
            out[f"value_head.{m.group(1)}"] = tensor.float().contiguous()
        elif "lora_" in key and ".default." in key:
            out[key.replace(".default.", f".{role}.")] = tensor.float().contiguous()
        else:
            raise VerlCheckpointError(f"{key}: neither a LoRA tensor of adapter 'default' nor the value head")
    if role == "critic" and "value_head.weight" not in out:
        raise VerlCheckpointError("the critic's checkpoint has no value head (was atlas.verl.critic loaded?)")
    return out


def write_policy_checkpoint(step_folder: Path, out: Path, manifest: dict) -> None:
    """global_step_<g>/{actor,critic} -> out/{actor,critic}.safetensors + MANIFEST.json, atomically."""
    with atomic_dir(out) as tmp:
        for role in ("actor", "critic"):
            tensors = policy_tensors(merged_state_dict(step_folder / role), role)
            save_file(tensors, str(tmp / f"{role}.safetensors"))
        write_manifest(tmp, **manifest)
