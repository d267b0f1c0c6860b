"""GAE over sampled tokens, and batch whitening of advantages, in verl's conventions.

The MDP's time steps are the trajectory positions with sampled == 1 (sampled from the policy).
Prompt tokens, tool output (loss_mask 0) and tokens forced by the grammar (loss_mask 1, sampled 0)
are not steps: the recursion skips them, carrying the next step's value and running advantage
across the gap, so a trajectory with gaps gives the same advantages as its sampled tokens alone.
For consecutive steps t < t' (t' the next sampled position):

    delta_t = r_t + gamma * V_{t'} - V_t        (V after the last step = 0)
    A_t     = delta_t + gamma * lam * A_{t'}
    R_t     = A_t + V_t                          (the critic's target)

This is what verl 0.9.1's `compute_gae_advantage_return(token_level_rewards, values,
response_mask, gamma, lam)` computes at response_mask-1 positions when response_mask is our
sampled mask (checked in tests/unit/test_rl_math.py). verl then whitens the advantages over the whole
batch (`whiten=True` here does the same; returns are never whitened). Two corners differ, both at
positions no loss or statistic reads:
- at mask-0 positions verl's advantage is the carried advantage of the next step (and its return
  that plus V there); here both are 0, so a sum that forgets the mask cannot double-count;
- verl silently drops a reward placed on a mask-0 token; here it is an error (rewards sit on
  action tokens, which are always sampled).
"""

from __future__ import annotations

import torch


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, keep_mean: bool = False) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with mean and variance over the mask-1 entries of all of `x`.

    As verl's `masked_whiten`: the variance is unbiased (Bessel's n / (n - 1)), eps 1e-8 sits
    inside the square root, and by default the mean is NOT added back (verl's shift_mean=True),
    so the whitened advantages have mean 0 over the mask. `keep_mean=True` adds it back.
    Mask-0 entries come out 0 (verl leaves them shifted and scaled).
    """
    m = mask.bool()
    n = int(m.sum())
    if n < 2:
        raise ValueError(f"whitening needs at least 2 mask-1 entries, got {n}")
    selected = x[m]
    mean = selected.mean()
    var = ((selected - mean) ** 2).sum() / (n - 1)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if keep_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def gae_over_sampled_batch(
    rewards: torch.Tensor,
    values: torch.Tensor,
    sampled_mask: torch.Tensor,
    gamma: float,
    lam: float,
    *,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [B, T], for a padded batch of trajectories.

    rewards, values: [B, T] per token; sampled_mask: [B, T], 1 = sampled (an MDP step), 0 =
    prompt, tool output, forced or padding. Advantages and returns are 0 where sampled_mask is 0.
    `whiten` whitens the advantages over every sampled token of the batch (verl's GAE does).
    Computed without gradients: advantages and returns are targets, not functions of the model.
    """
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != sampled_mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and sampled_mask "
            f"{tuple(sampled_mask.shape)} must be one [B, T] shape"
        )
    steps = sampled_mask.bool()
    stray = (rewards != 0) & ~steps
    if stray.any():
        row, pos = (int(i) for i in stray.nonzero()[0])
        raise ValueError(
            f"{int(stray.sum())} non-zero rewards on non-sampled tokens (first: row {row}, position "
            f"{pos}, reward {float(rewards[row, pos])}); rewards belong on action tokens"
        )
    with torch.no_grad():
        advantages = torch.zeros_like(rewards)
        next_value = torch.zeros_like(rewards[:, 0])  # V at the next step of each row (0 after the last)
        next_advantage = torch.zeros_like(rewards[:, 0])  # A at the next step of each row
        for t in reversed(range(rewards.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            here = steps[:, t]
            advantages[:, t] = torch.where(here, advantage, 0.0)
            # Non-steps leave the carry untouched: the gap is skipped, not a zero-reward step.
            next_value = torch.where(here, values[:, t], next_value)
            next_advantage = torch.where(here, advantage, next_advantage)
        returns = torch.where(steps, advantages + values, 0.0)
        if whiten:
            advantages = masked_whiten(advantages, steps)
    return advantages, returns


def gae_over_sampled(
    rewards: torch.Tensor, values: torch.Tensor, sampled_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [T], for one trajectory; see `gae_over_sampled_batch`."""
    if rewards.dim() != 1:
        raise ValueError(f"one trajectory is a 1-D tensor, got shape {tuple(rewards.shape)}")
    adv, ret = gae_over_sampled_batch(rewards[None], values[None], sampled_mask[None], gamma, lam)
    return adv[0], ret[0]
