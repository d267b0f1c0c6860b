"""Distributed roundtrip: a run's last compact checkpoint in an FSDP2-sharded policy, one step.

Started by torchrun (gloo on CPU, NCCL on GPUs), world size 2 in the pipeline:

    torchrun --standalone --nproc-per-node 2 -m atlas.stages.distributed_roundtrip --config-slice '{...}' \
        --model results/models/tiny --run-folder results/runs/<run> --out <folder>

Each rank builds the policy in float32 and takes the reference step below unsharded; then it
shards that same policy with `fully_shard` (each decoder layer, then the LM, and the value head),
loads the checkpoint's full tensors into the shards (`set_model_state_dict`), and runs one step
on its half of a fixed batch (the last BATCH_TOKENS tokens of the run's first training
trajectories): the critic regresses the values toward each trajectory's score, the
actor takes a policy-gradient step on the sampled tokens with advantage = score - mean score
+- 1 (alternating by row, so the actor term is never zero),
each as a token mean over the *whole* batch (a rank scales its sum by world size / all tokens,
because FSDP averages gradients over ranks). Then:

  - the full gradients (gathered) are compared with one process taking the same step on the whole
    batch, unsharded: max abs difference against a tolerance of 1e-6 + 1e-5 * |g|. The terms are
    identical; only the order of float32 additions differs (two half-batch sums reduced, against
    one sum), and each addition rounds at 2^-24 relative, so differences stay around 1e-7
    relative; 1e-5 leaves room for a few hundred tokens of accumulated rounding, while a missing
    or doubled half-batch would be off by 50% or more;
  - after AdamW steps the sha256 of every full trainable tensor must agree across ranks; a rank
    that diverges fails the check with the tensor's name.

Each rank writes distributed_roundtrip_rank_<r>.json. `--perturb-rank R` shifts rank R's shards
of the actor before the step: a rank whose state diverged. Its shards feed every rank's forward,
so the gathered gradients leave the single-process ones and the check names the first tensor.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers import AutoModelForCausalLM

from atlas.checks.roundtrip import next_token_logprobs
from atlas.config.training import TrainingConfig
from atlas.contracts.parquet import read_table
from atlas.model.policy import ROLES, ActorCritic

ATOL, RTOL = 1e-6, 1e-5
# Tokens per row of the fixed batch: enough for every sharded collective and both losses, and at
# a real shape (1.7B on two CPU ranks, where one GPU cannot hold two NCCL ranks) seconds, not
# minutes, of float32 compute.
BATCH_TOKENS = 32


def fixed_batch(
    trajectories: Path, rows: int, width: int = BATCH_TOKENS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [rows, W], sampled mask [rows, W] and score [rows]: the last W tokens of each of the
    run's first training trajectories, W = `width` or the shortest trajectory's length. A row's
    end is its last generation, so every row holds sampled tokens, and there is no padding."""
    table = [r for r in read_table(trajectories).to_pylist() if r["phase"] == "train"][:rows]
    if len(table) < rows:
        raise ValueError(f"{trajectories}: {len(table)} training trajectories, the roundtrip takes {rows}")
    width = min(width, *(len(r["token_ids"]) for r in table))
    ids = torch.tensor([r["token_ids"][-width:] for r in table])
    sampled = torch.tensor([r["sampled"][-width:] for r in table], dtype=torch.float32)
    if not sampled[:, 1:].any(dim=1).all():
        raise ValueError(f"{trajectories}: a trajectory's last {width} tokens hold no sampled token")
    return ids, sampled, torch.tensor([r["score"] for r in table], dtype=torch.float32)


def losses(
    ac: ActorCritic, ids, sampled, score, adv, total_tokens: float, scale: float
) -> dict[str, torch.Tensor]:
    """Critic and actor losses of these rows, as their share of a token mean over all rows."""
    mask = sampled[:, 1:]
    adv = adv[:, None]
    out = {}
    with ac.role("critic"):
        v = ac.values(ids)[:, :-1]
        out["critic"] = ((v - score[:, None]) ** 2 * mask).sum() / total_tokens * scale
        out["critic"].backward()
    with ac.role("actor"):
        logp = next_token_logprobs(ac.actor_logits(ids), ids)
        out["actor"] = (-(adv * logp) * mask).sum() / total_tokens * scale
        out["actor"].backward()
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    """A copy on the CPU (of the whole tensor, when sharded): never the live gradient's storage."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().to("cpu", copy=True)


def build(model_dir: Path, training: TrainingConfig, seed: int) -> ActorCritic:
    """The policy in float32, whatever dtype the base was saved in: the tolerance is float32's."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return ActorCritic(base, training, seed=seed)


def checkpoint_tensors(run_folder: Path) -> tuple[dict[str, torch.Tensor], int, str]:
    index = json.loads((run_folder / "checkpoints.json").read_text(encoding="utf-8"))
    last = index["checkpoints"][-1]
    tensors = {}
    for role in ROLES:
        tensors.update(load_file(str(Path(last["path"]) / f"{role}.safetensors")))
    return tensors, last["step"], last["path"]


def load_full(ac: ActorCritic, tensors: dict[str, torch.Tensor]) -> None:
    """Full tensors into the (possibly sharded) policy; the value head is its own FSDP module."""
    peft_part = {n: t for n, t in tensors.items() if not n.startswith("value_head.")}
    head_part = {n.removeprefix("value_head."): t for n, t in tensors.items() if n.startswith("value_head.")}
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(ac.peft, peft_part, options=opts)
    set_model_state_dict(ac.value_head, head_part, options=StateDictOptions(full_state_dict=True))


def step_grads(ac, ids, sampled, score, adv, total, scale) -> dict[str, torch.Tensor]:
    losses(ac, ids, sampled, score, adv, total, scale)
    return {n: full(p.grad) for role in ROLES for n, p in ac.trainable(role).items()}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
