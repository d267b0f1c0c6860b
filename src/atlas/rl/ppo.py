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

from dataclasses import dataclass

import torch

from atlas.model.policy import ActorCritic
from atlas.rl.advantages import gae_over_sampled_batch
from atlas.rl.losses import entropy_from_logits, kl_penalty, masked_mean, policy_loss, value_loss
from atlas.rl.replay import ReplayedMasks, masked_logprobs


@dataclass(frozen=True)
class PPOSettings:
    gamma: float = 1.0
    lam: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float = 3.0
    cliprange_value: float = 0.5
    kl_kind: str = "k3"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    mini_batches: int = 1
    micro_batch_size: int = 8
    grad_clip: float = 1.0
    whiten_advantages: bool = True
    temperature: float = 1.0


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


def make_batch(episodes, token_rewards: list[torch.Tensor], masks: list[ReplayedMasks], pad_id: int) -> Batch:
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
    return Batch(ids, attn, sampled, logprobs, rewards, masks)


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


def ppo_update(
    ac: ActorCritic,
    batch: Batch,
    optimizers: dict[str, torch.optim.Optimizer],
    settings: PPOSettings,
) -> dict[str, float]:
    n = batch.input_ids.shape[0]
    metrics: dict[str, float] = {}
    mask = batch.sampled

    # No-grad passes: old log-probs (actor), reference log-probs, values.
    with torch.no_grad():
        old_lp, ref_lp, values = torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros_like(mask)
        for idx in _micro(list(range(n)), settings.micro_batch_size):
            sub = batch.rows(idx)
            old_lp[idx] = token_logprobs(
                ac.actor_logits(sub.input_ids, sub.attention), sub, settings.temperature
            )
            ref_lp[idx] = token_logprobs(
                ac.reference_logits(sub.input_ids, sub.attention), sub, settings.temperature
            )
            values[idx] = aligned_values(ac, sub)
        values = values * mask
        advantages, returns = gae_over_sampled_batch(
            batch.rewards, values, mask, settings.gamma, settings.lam, whiten=settings.whiten_advantages
        )
    gap = ((old_lp - batch.rollout_logprobs).abs() * mask).max().item()
    metrics["rollout/logprob_gap_max"] = gap
    metrics["critic/advantages/mean"] = masked_mean(advantages, mask).item()
    metrics["critic/returns/mean"] = masked_mean(returns, mask).item()
    metrics["critic/values/mean"] = masked_mean(values, mask).item()
    metrics["critic/rewards/mean"] = (batch.rewards.sum(-1)).mean().item()

    order = list(range(n))
    mini = max(1, n // settings.mini_batches)
    for role in ("critic", "actor"):
        params = list(ac.trainable(role).values())
        opt = optimizers[role]
        sums: dict[str, float] = {}
        for start in range(0, n, mini):
            rows = order[start : start + mini]
            opt.zero_grad(set_to_none=True)
            tokens = mask[rows].sum()
            for idx in _micro(rows, settings.micro_batch_size):
                sub = batch.rows(idx)
                weight = (mask[idx].sum() / tokens).item()  # token-mean over the mini-batch
                with ac.role(role):
                    if role == "critic":
                        vpred = aligned_values(ac, sub)
                        out = value_loss(
                            vpred,
                            values[idx],
                            returns[idx],
                            mask[idx],
                            settings.cliprange_value,
                            agg=settings.loss_agg_mode,
                        )
                        loss = out["critic/vf_loss"]
                    else:
                        logits = ac.actor_logits(sub.input_ids, sub.attention)
                        lp = token_logprobs(logits, sub, settings.temperature)
                        out = policy_loss(
                            lp,
                            old_lp[idx],
                            advantages[idx],
                            mask[idx],
                            settings.clip_low,
                            settings.clip_high,
                            settings.clip_ratio_c,
                            agg=settings.loss_agg_mode,
                        )
                        loss = out["actor/pg_loss"]
                        if settings.kl_coef:
                            kl = masked_mean(kl_penalty(lp, ref_lp[idx], settings.kl_kind), mask[idx])
                            loss = loss + settings.kl_coef * kl
                            out["actor/kl_loss"] = kl
                        if settings.entropy_coef:  # entropy of the raw (unmasked) next-token distribution
                            ent = entropy_from_logits(logits[:, :-1]).float()
                            ent = masked_mean(torch.cat([torch.zeros_like(ent[:, :1]), ent], 1), mask[idx])
                            loss = loss - settings.entropy_coef * ent
                            out["actor/entropy"] = ent
                (loss * weight).backward()
                for k, v in out.items():
                    sums[k] = sums.get(k, 0.0) + float(torch.as_tensor(v).detach()) * weight
            grad_norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            opt.step()
            sums[f"{role}/grad_norm"] = sums.get(f"{role}/grad_norm", 0.0) + grad_norm.item()
        batches = -(-n // mini)
        metrics.update({k: v / batches for k, v in sums.items()})
    return metrics
