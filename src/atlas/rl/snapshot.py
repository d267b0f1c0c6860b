"""The frozen-potential arm's Phi: the value of a frozen critic snapshot from another run.

    Phi(s_k) = V_snapshot(state before generation k)
             = the snapshot critic's value after reading token generation_start_k - 1

The snapshot is a compact checkpoint's critic (LoRA tensors + value head) of a named run, by
default the training smoke's last. It is found through the run's folder: `checkpoints.json` there
lists every checkpoint's files and sha256, so the potential reads exactly the bytes the run
recorded (and the run folder is the Snakemake input that makes the arm rerun when it changes).
The snapshot is loaded as a third, frozen adapter on the policy's own base weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from atlas.errors import InputError
from atlas.hashing import sha256_file
from atlas.model.fused_lora import fused_lora
from atlas.model.liger import liger_rope
from atlas.model.policy import ActorCritic
from atlas.rl.packing import decoder, pack, packed_attention, token_budget_cut
from atlas.rl.potentials import EpisodeLike, register_potential

CHECKPOINTS_JSON = "checkpoints.json"
SNAPSHOT_ADAPTER = "snapshot"
BATCH_TOKENS = 16384  # tokens per packed forward of CriticSnapshotPotential.batch


def snapshot_file(run_folder: str | Path, step: int | None) -> tuple[Path, int]:
    """The verified critic.safetensors of `run_folder`'s checkpoint `step` (None: the last)."""
    index_path = Path(run_folder) / CHECKPOINTS_JSON
    if not index_path.is_file():
        raise InputError(f"{index_path}: missing; the snapshot run has not finished training")
    index = json.loads(index_path.read_text(encoding="utf-8"))
    steps = {c["step"]: c for c in index["checkpoints"]}
    if not steps:
        raise InputError(f"{index_path}: lists no checkpoints")
    chosen = max(steps) if step is None else step
    if chosen not in steps:
        raise InputError(f"{index_path}: no checkpoint for step {chosen}; it lists {sorted(steps)}")
    entry = steps[chosen]
    path = Path(entry["path"]) / "critic.safetensors"
    expected = entry["files"]["critic.safetensors"]["sha256"]
    if not path.is_file():
        raise InputError(f"{path}: missing; {index_path} lists it for step {chosen}")
    if (digest := sha256_file(path)) != expected:
        raise InputError(f"{path}: sha256 {digest}, but {index_path} recorded {expected}")
    return path, chosen


@register_potential("critic_snapshot")
class CriticSnapshotPotential:
    """Phi from a frozen critic snapshot sharing `model`'s base weights."""

    def __init__(self, *, model: ActorCritic, run_folder: str | Path, step: int | None = None):
        path, self.step = snapshot_file(run_folder, step)
        self.source = str(path)
        self.model = model
        model.add_frozen_critic(SNAPSHOT_ADAPTER, load_file(str(path)))

    def __call__(self, episode: EpisodeLike) -> list[float]:
        ids = torch.tensor([list(episode.token_ids)], device=self.model.value_head.weight.device)
        values = self.model.frozen_values(SNAPSHOT_ADAPTER, ids)[0]
        return [float(values[r.generation_start - 1]) for r in episode.records]

    def batch(self, episodes: Sequence[EpisodeLike], packed: bool | None = None) -> list[list[float]]:
        """Phi of many episodes. `packed` (by default on a GPU): the episodes packed into rows of
        at most BATCH_TOKENS tokens through the update's packed path (varlen attention, the
        adapter fused into the base GEMM), one adapter switch for all; otherwise episode by
        episode, the reference (a step's 256 episodes one forward and two adapter switches each
        cost about a minute at the 1.7B shape on a GPU)."""
        ac = self.model
        device = ac.value_head.weight.device
        if not (device.type == "cuda" if packed is None else packed):
            return [self(ep) for ep in episodes]
        lengths = [len(ep.token_ids) for ep in episodes]
        out: list[list[float]] = [[] for _ in episodes]
        # the update's packed path (atlas.rl.ppo.Passes), without importing the update: a verl
        # run's agent loop builds this potential and must not rerun when the update changes
        with (
            torch.no_grad(),
            liger_rope(ac.peft),
            packed_attention(ac.peft),
            fused_lora(ac.peft),
            ac.role(SNAPSHOT_ADAPTER),
        ):
            for rows in token_budget_cut(list(range(len(episodes))), lengths, BATCH_TOKENS):
                ids = torch.zeros((len(rows), max(lengths[i] for i in rows)), dtype=torch.long)
                attention = torch.zeros_like(ids)
                for r, i in enumerate(rows):
                    ids[r, : lengths[i]] = torch.tensor(list(episodes[i].token_ids))
                    attention[r, : lengths[i]] = 1
                pk = pack(ids.to(device), attention.to(device))
                hidden = decoder(ac.peft)(**pk.model_kwargs()).last_hidden_state
                head = ac.frozen_heads[SNAPSHOT_ADAPTER]
                values = pk.unpack(head(hidden[0].float()).squeeze(-1)).cpu()  # V after reading token t
                for r, i in enumerate(rows):
                    out[i] = [float(values[r, rec.generation_start - 1]) for rec in episodes[i].records]
        return out

    def __repr__(self) -> str:
        return f"CriticSnapshotPotential({self.source}, step {self.step})"
