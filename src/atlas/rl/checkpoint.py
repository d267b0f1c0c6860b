"""Compact checkpoints: only what training changes, so a 27B run saves megabytes, not the model.

    <root>/step_<k>/
        actor.safetensors       actor LoRA tensors, by parameter name
        critic.safetensors      critic LoRA tensors and the value head
        optim_actor.safetensors AdamW moments and step counts of the actor, by parameter name
        optim_critic.safetensors
        rng.safetensors         torch's CPU generator state (and CUDA's, when used); of a
                                data-parallel job, every rank's (`torch.rank<r>` for rank r > 0)
        state.json              step, optimizer param groups, scheduler states, python RNG state
                                (each rank's), the schedule position and anything else the
                                trainer passes
        MANIFEST.json

A checkpoint folder appears whole or not at all (written beside, then renamed), so the latest
`step_*` folder with a MANIFEST.json is always complete: `resume_mode: auto` continues from it.
Checkpoints live outside the training job's declared outputs (results/checkpoints/<run>/), so a
rerun of an interrupted job finds them instead of Snakemake deleting them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from atlas.hashing import MANIFEST, atomic_dir, write_manifest
from atlas.model.policy import ROLES, ActorCritic

STATE = "state.json"


def _optimizer_tensors(opt: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], list]:
    """Optimizer state keyed by parameter name (not by position), and its param groups."""
    sd = opt.state_dict()
    tensors = {}
    for index, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"{names[index]}::{key}"] = torch.as_tensor(value).detach().clone().contiguous()
    return tensors, sd["param_groups"]


def _load_optimizer(
    opt: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor], groups: list
) -> None:
    index = {n: i for i, n in enumerate(names)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, _, field = key.rpartition("::")
        state.setdefault(index[name], {})[field] = value
    opt.load_state_dict({"state": state, "param_groups": groups})


def save_trainable(folder: Path, model: ActorCritic) -> None:
    """{actor,critic}.safetensors: each role's trainable tensors by name (the policy alone)."""
    for role in ROLES:
        params = model.trainable(role)
        save_file(
            {n: params[n].detach().contiguous() for n in sorted(params)}, str(folder / f"{role}.safetensors")
        )


def load_trainable(folder: str | Path, model: ActorCritic) -> None:
    """Copy {actor,critic}.safetensors into the policy; the names must be exactly its trainable ones."""
    for role in ROLES:
        path = Path(folder) / f"{role}.safetensors"
        params, saved = model.trainable(role), load_file(str(path))
        if set(saved) != set(params):
            missing, extra = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
            raise ValueError(f"{path}: tensors missing {missing[:3]}, unexpected {extra[:3]}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])


def rng_state() -> dict[str, Any]:
    """This process's random generators: torch's CPU (and CUDA's, when used) and python's."""
    out: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    version, internal, gauss = random.getstate()
    out["python"] = [version, list(internal), gauss]
    return out


def _suffix(rank: int) -> str:
    return "" if rank == 0 else f".rank{rank}"


def save_compact(
    root: str | Path,
    step: int,
    model: ActorCritic,
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    extra: dict[str, Any],
    rngs: list[dict[str, Any]] | None = None,
) -> Path:
    """Write step_<step> under root atomically; `extra` must be plain JSON (schedule position...).
    `rngs`: every rank's rng_state() in a data-parallel job (rank 0 writes); default this one's."""
    rngs = rngs or [rng_state()]
    out = Path(root) / f"step_{step}"
    state: dict[str, Any] = {"step": step, "extra": extra, "param_groups": {}, "schedulers": {}}
    with atomic_dir(out) as tmp:
        save_trainable(tmp, model)
        for role in ROLES:
            names = sorted(model.trainable(role))
            tensors, groups = _optimizer_tensors(optimizers[role], names)
            save_file(tensors, str(tmp / f"optim_{role}.safetensors"))
            state["param_groups"][role] = groups
            state["schedulers"][role] = schedulers[role].state_dict() if role in schedulers else None
        rng = {f"{k}{_suffix(r)}": v for r, one in enumerate(rngs) for k, v in one.items() if k != "python"}
        save_file(rng, str(tmp / "rng.safetensors"))
        state["python_random"] = rngs[0]["python"]
        if len(rngs) > 1:  # a one-process checkpoint keeps its layout
            state["ranks"] = len(rngs)
            state["python_random_ranks"] = [one["python"] for one in rngs[1:]]
        (tmp / STATE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        write_manifest(tmp, stage="compact_checkpoint", config={"step": step})
    return out


def load_compact(
    path: str | Path,
    model: ActorCritic,
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    rank: int = 0,
    world: int = 1,
) -> dict[str, Any]:
    """Restore tensors, optimizer and scheduler states and RNGs (rank `rank`'s of a job of `world`
    ranks); return the saved state.json."""
    path = Path(path)
    state = json.loads((path / STATE).read_text(encoding="utf-8"))
    if state.get("ranks", 1) != world:
        raise ValueError(f"{path}: a checkpoint of {state.get('ranks', 1)} ranks, loaded by a job of {world}")
    load_trainable(path, model)
    for role in ROLES:
        params = model.trainable(role)
        _load_optimizer(
            optimizers[role],
            sorted(params),
            load_file(str(path / f"optim_{role}.safetensors")),
            state["param_groups"][role],
        )
        if state["schedulers"][role] is not None:
            schedulers[role].load_state_dict(state["schedulers"][role])
    rng, mine = load_file(str(path / "rng.safetensors")), _suffix(rank)
    torch.set_rng_state(rng[f"torch{mine}"])
    if f"cuda{mine}" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng[f"cuda{mine}"])
    version, internal, gauss = state["python_random"] if rank == 0 else state["python_random_ranks"][rank - 1]
    random.setstate((version, tuple(internal), gauss))
    return state


def checkpoint_steps(root: str | Path) -> list[int]:
    """The steps k of the complete step_<k> folders under root (those with a MANIFEST.json)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit() and (p / MANIFEST).is_file()
    )


def latest_checkpoint(root: str | Path) -> Path | None:
    """The highest complete step_<k> under root, or None."""
    steps = checkpoint_steps(root)
    return Path(root) / f"step_{steps[-1]}" if steps else None


def export_adapters(model: ActorCritic, out: str | Path) -> None:
    """PEFT folders `PeftModel.from_pretrained` loads (actor/, critic/) and the value head."""
    out = Path(out)
    model.peft.save_pretrained(out, selected_adapters=list(ROLES))
    head = {f"value_head.{n}": p.detach().contiguous() for n, p in model.value_head.named_parameters()}
    save_file(head, str(out / "critic" / "value_head.safetensors"))
