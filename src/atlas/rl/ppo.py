"""One PPO update from a batch of finished episodes: the middle of DESIGN.md's training step.

    episodes (records, token ids, masks, rollout log-probs)
    --> rewards: score + shaping on each record's action token (rewards.py)
    --> old log-probs under the replayed grammar masks (actor), reference log-probs (adapters
        off), values (critic) -- no grad
    --> GAE over sampled tokens, advantages whitened over the batch (advantages.py)
    --> critic update (clipped value loss), then actor update (clipped surrogate + KL to the
        reference + optional entropy bonus), in micro-batches accumulated per mini-batch

Token tensors are [B, T], right-padded. The loss mask of both updates is `sampled`: forced
tokens, prompt and tool output never enter a loss. V[:, t] is the critic's value of the state
*before* token t (its output at position t - 1), as verl aligns values with response tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from atlas.config import PPOConfig
from atlas.model.policy import ActorCritic
from atlas.rl.advantages import gae_over_sampled_batch
from atlas.rl.losses import entropy_from_logits, kl_penalty, masked_mean, policy_loss, value_loss
from atlas.rl.replay import ReplayedMasks, masked_logprobs


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention: torch.Tensor  # [B, T] 1 = real token
    sampled: torch.Tensor  # [B, T] float: 1 = sampled by the policy (the loss mask of PPO)
    rollout_logprobs: torch.Tensor  # [B, T]
    rewards: torch.Tensor  # [B, T] rewards on action tokens
    masks: list[ReplayedMasks]

    def rows(self, idx: list[int]) -> Batch:
        return Batch(
            self.input_ids[idx],
            self.attention[idx],
            self.sampled[idx],
            self.rollout_logprobs[idx],
            self.rewards[idx],
            [self.masks[i] for i in idx],
        )


def make_batch(
    episodes, token_rewards: list[torch.Tensor], masks: list[ReplayedMasks], pad_id: int, device="cpu"
) -> Batch:
    """The episodes right-padded into one batch, on the policy's `device`."""
    width = max(len(ep.token_ids) for ep in episodes)
    n = len(episodes)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    sampled = torch.zeros((n, width))
    logprobs = torch.zeros((n, width))
    rewards = torch.zeros((n, width))
    for i, ep in enumerate(episodes):
        k = len(ep.token_ids)
        ids[i, :k] = torch.tensor(ep.token_ids)
        attn[i, :k] = 1
        sampled[i, :k] = torch.tensor(ep.sampled, dtype=torch.float32)
        logprobs[i, :k] = torch.tensor(ep.logprobs, dtype=torch.float32)
        rewards[i, :k] = token_rewards[i]
    masks = [ReplayedMasks(m.positions.to(device), m.bitmask.to(device)) for m in masks]
    return Batch(*(t.to(device) for t in (ids, attn, sampled, logprobs, rewards)), masks)


def token_logprobs(logits: torch.Tensor, batch: Batch, temperature: float) -> torch.Tensor:
    """[B, T] log-probs of every generated token under its replayed mask (0 elsewhere)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=logits.device)
    for i, m in enumerate(batch.masks):
        pos = m.positions.to(logits.device)
        lp = masked_logprobs(logits[i, pos - 1], batch.input_ids[i, pos], m.bitmask, temperature)
        out[i] = out[i].index_put((pos,), lp)
    return out


def aligned_values(ac: ActorCritic, batch: Batch) -> torch.Tensor:
    v = ac.values(batch.input_ids, batch.attention)
    return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)  # V before token t


def _micro(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def make_optimizers(ac: ActorCritic, ppo: PPOConfig) -> dict[str, torch.optim.Optimizer]:
    """AdamW per role over exactly the tensors a compact checkpoint holds, in name order."""
    lrs = {"actor": ppo.actor_lr, "critic": ppo.critic_lr}
    return {
        role: torch.optim.AdamW(
            [p for _, p in sorted(ac.trainable(role).items())],
            lr=lrs[role],
            betas=ppo.betas,
            eps=ppo.eps,
            weight_decay=ppo.weight_decay,
        )
        for role in ("actor", "critic")
    }


def lr_factor(ppo: PPOConfig, total_updates: int) -> Callable[[int], float]:
    """LR multiplier after `k` optimizer steps: linear warm-up, then constant or cosine."""

    def factor(k: int) -> float:
        if k < ppo.warmup_steps:
            return (k + 1) / (ppo.warmup_steps + 1)
        if ppo.lr_schedule == "constant":
            return 1.0
        span = max(1, total_updates - ppo.warmup_steps)
        progress = min(1.0, (k - ppo.warmup_steps) / span)
        return ppo.min_lr_ratio + (1 - ppo.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def make_schedulers(
    optimizers: dict[str, torch.optim.Optimizer], ppo: PPOConfig, steps: int
) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
    total = steps * ppo.epochs * ppo.mini_batches
    return {
        role: torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(ppo, total))
        for role, opt in optimizers.items()
    }


def _stats(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    on = x[mask.bool()]
    if on.numel() == 0:
        return {f"{name}/mean": 0.0, f"{name}/max": 0.0, f"{name}/min": 0.0}
    return {f"{name}/mean": on.mean().item(), f"{name}/max": on.max().item(), f"{name}/min": on.min().item()}


@dataclass
class Prepared:
    """Everything the updates need that does not change during them (no gradients)."""

    old_logprobs: torch.Tensor  # [B, T] actor, under the replayed masks
    ref_logprobs: torch.Tensor  # [B, T] reference (adapters off), same masks
    values: torch.Tensor  # [B, T] critic: V of the state before token t; 0 off the mask
    rewards: torch.Tensor  # [B, T] the batch's rewards, minus the KL penalty with kl_mode: reward
    advantages: torch.Tensor  # [B, T] GAE (whitened if configured); 0 off the mask
    returns: torch.Tensor  # [B, T]
    metrics: dict[str, float]


def prepare(ac: ActorCritic, batch: Batch, ppo: PPOConfig, temperature: float) -> Prepared:
    """Old log-probs, reference log-probs and values in micro-batches, then GAE."""
    n, mask = batch.input_ids.shape[0], batch.sampled
    chunks = _micro(list(range(n)), ppo.micro_batch_size)
    metrics: dict[str, float] = {}
    old_lp, ref_lp, values = torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros_like(mask)
    with torch.no_grad():
        t = time.perf_counter()
        for idx in chunks:
            sub = batch.rows(idx)
            old_lp[idx] = token_logprobs(ac.actor_logits(sub.input_ids, sub.attention), sub, temperature)
        metrics["timing_s/old_log_prob"] = time.perf_counter() - t
        t = time.perf_counter()
        if ppo.kl_mode != "none":
            for idx in chunks:
                sub = batch.rows(idx)
                ref_lp[idx] = token_logprobs(
                    ac.reference_logits(sub.input_ids, sub.attention), sub, temperature
                )
        metrics["timing_s/ref"] = time.perf_counter() - t
        t = time.perf_counter()
        for idx in chunks:
            values[idx] = aligned_values(ac, batch.rows(idx))
        values = values * mask
        metrics["timing_s/values"] = time.perf_counter() - t

        t = time.perf_counter()
        rewards = batch.rewards
        if ppo.kl_mode == "reward":  # verl's apply_kl_penalty: every sampled token pays beta * KL
            kl = kl_penalty(old_lp, ref_lp, ppo.kl_kind) * mask
            rewards = rewards - ppo.kl_coef * kl
            metrics["actor/reward_kl_penalty"] = masked_mean(kl, mask).item()
            metrics["actor/reward_kl_penalty_coeff"] = ppo.kl_coef
        advantages, returns = gae_over_sampled_batch(
            rewards, values, mask, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages
        )
        metrics["timing_s/adv"] = time.perf_counter() - t

    gap = (old_lp - batch.rollout_logprobs).abs() * mask
    metrics["rollout/logprob_gap_max"] = gap.max().item()
    metrics["rollout/logprob_gap_mean"] = masked_mean(gap, mask).item()
    for name, x in (
        ("critic/advantages", advantages),
        ("critic/returns", returns),
        ("critic/values", values),
    ):
        metrics.update(_stats(name, x, mask))
    rows = torch.ones(n, 1)
    metrics.update(_stats("critic/rewards", rewards.sum(-1, keepdim=True), rows))
    on = mask.bool()
    residual = (returns - values)[on]
    var_returns = returns[on].var() if on.sum() > 1 else torch.tensor(0.0)
    explained = 1 - residual.var() / var_returns if var_returns > 0 else torch.tensor(0.0)
    metrics["critic/vf_explained_var"] = explained.item()
    return Prepared(old_lp, ref_lp, values, rewards, advantages, returns, metrics)


def _role_loss(role, ac, sub, idx, prep: Prepared, ppo: PPOConfig, temperature: float):
    mask = sub.sampled
    if role == "critic":
        vpred = aligned_values(ac, sub)
        out = value_loss(
            vpred, prep.values[idx], prep.returns[idx], mask, ppo.cliprange_value, agg=ppo.loss_agg_mode
        )
        return out["critic/vf_loss"], out
    logits = ac.actor_logits(sub.input_ids, sub.attention)
    lp = token_logprobs(logits, sub, temperature)
    out = policy_loss(
        lp,
        prep.old_logprobs[idx],
        prep.advantages[idx],
        mask,
        ppo.clip_ratio_low,
        ppo.clip_ratio_high,
        ppo.clip_ratio_c,
        agg=ppo.loss_agg_mode,
    )
    loss = out["actor/pg_loss"]
    if ppo.kl_mode == "loss":
        kl = masked_mean(kl_penalty(lp, prep.ref_logprobs[idx], ppo.kl_kind), mask)
        loss = loss + ppo.kl_coef * kl
        out["actor/kl_loss"], out["actor/kl_coef"] = kl, ppo.kl_coef
    if ppo.entropy_coef:  # entropy of the raw (unmasked) next-token distribution
        ent = entropy_from_logits(logits[:, :-1]).float()
        ent = masked_mean(torch.cat([torch.zeros_like(ent[:, :1]), ent], 1), mask)
        loss = loss - ppo.entropy_coef * ent
        out["actor/entropy"] = ent
    return loss, out


def update(
    ac: ActorCritic,
    batch: Batch,
    prep: Prepared,
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, torch.optim.lr_scheduler.LRScheduler] | None,
    ppo: PPOConfig,
    temperature: float,
) -> dict[str, float]:
    """The critic update, then the actor update: `epochs` passes of `mini_batches` optimizer steps,
    each accumulating micro-batch gradients weighted by their share of the mini-batch's tokens."""
    n, mask = batch.input_ids.shape[0], batch.sampled
    mini = -(-n // ppo.mini_batches)
    metrics: dict[str, float] = {}
    for role in ("critic", "actor"):
        t = time.perf_counter()
        params = list(ac.trainable(role).values())
        opt = optimizers[role]
        sums: dict[str, float] = {}
        count = 0
        metrics[f"{role}/lr"] = opt.param_groups[0]["lr"]
        for _ in range(ppo.epochs):
            for start in range(0, n, mini):
                rows = list(range(start, min(n, start + mini)))
                opt.zero_grad(set_to_none=True)
                tokens = mask[rows].sum().clamp(min=1)
                for idx in _micro(rows, ppo.micro_batch_size):
                    sub = batch.rows(idx)
                    weight = (mask[idx].sum() / tokens).item()  # token share of the mini-batch
                    # backward inside the role: peft clears requires_grad of inactive adapters,
                    # and autograd skips accumulating into a tensor that no longer requires grad
                    with ac.role(role):
                        loss, out = _role_loss(role, ac, sub, idx, prep, ppo, temperature)
                        (loss * weight).backward()
                    for k, v in out.items():
                        sums[k] = sums.get(k, 0.0) + float(torch.as_tensor(v).detach()) * weight
                grad_norm = torch.nn.utils.clip_grad_norm_(params, ppo.grad_clip)
                opt.step()
                if schedulers is not None:
                    schedulers[role].step()
                sums[f"{role}/grad_norm"] = sums.get(f"{role}/grad_norm", 0.0) + grad_norm.item()
                count += 1
        metrics.update({k: v / count for k, v in sums.items()})
        metrics[f"timing_s/update_{role}"] = time.perf_counter() - t
    return metrics


def ppo_update(
    ac: ActorCritic,
    batch: Batch,
    optimizers: dict[str, torch.optim.Optimizer],
    ppo: PPOConfig,
    temperature: float = 1.0,
    schedulers: dict | None = None,
) -> dict[str, float]:
    """prepare + update, for callers that do not look between them."""
    prep = prepare(ac, batch, ppo, temperature)
    return {**prep.metrics, **update(ac, batch, prep, optimizers, schedulers, ppo, temperature)}
