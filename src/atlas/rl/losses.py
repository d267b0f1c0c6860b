"""PPO losses on token tensors [B, T] with a float mask [B, T], numerically as verl 0.9.1.

The mask says which tokens a loss or statistic counts: 1 = a policy action that is trained on.
For the actor that is the sampled mask (1 = sampled from the policy; a token forced by the
grammar was no choice of the policy, and under the grammar its log-prob is 0), for the critic the
steps GAE used (the same sampled mask).
Prompt, tool output (loss_mask 0) and padding are always 0.

aggregate     verl's loss_agg_mode: token-mean, seq-mean-token-sum, seq-mean-token-mean,
              seq-mean-token-sum-norm
policy_loss   clipped surrogate, asymmetric clip, dual clip        (compute_policy_loss_vanilla)
value_loss    0.5 x max(unclipped, clipped) squared error           (compute_value_loss)
kl_penalty    k1 / abs / mse (k2) / k3 (low_var_kl) estimators      (kl_penalty)
entropy_from_logits, masked_mean

Metric names are verl's: actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower,
critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "kl", "abs", "mse", "k2", "k3", "low_var_kl")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x * mask; entries outside the mask are replaced by 0 first, so a NaN or inf there
    (a padding position's log-ratio, say) cannot leak into the sum or its gradient."""
    kept = torch.where(mask.bool(), x, torch.zeros_like(x)) * mask
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over mask-1 entries (over all of x, or along `dim`). An empty mask is an error."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    if (count == 0).any():
        raise ValueError("masked_mean over an empty mask")
    return masked_sum(x, mask, dim) / count


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """One scalar from a [B, T] loss matrix, as verl's `agg_loss` (dp_size 1):

        token-mean               sum over mask-1 tokens / number of mask-1 tokens
        seq-mean-token-sum       per sequence the sum over its tokens; mean over sequences
        seq-mean-token-mean      per sequence the mean over its tokens (eps 1e-8); mean over sequences
        seq-mean-token-sum-norm  seq-mean-token-sum / loss_scale_factor, which defaults to T =
                                 mask.shape[-1], the padded length of THIS batch (verl's default,
                                 documented there as the horizon); set it to a constant (e.g. the
                                 max response length) for a normaliser that does not move with padding

    The seq-mean modes average over sequences with at least one mask-1 token (fully masked rows are
    left out of the count). The optional keywords replace the batch's own counts with global ones
    when one batch is split into micro-batches (as verl's global_batch_info): `batch_num_tokens`
    for token-mean, `global_batch_size` for the seq-mean modes.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {AGG_MODES}")
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    if mode == "token-mean":
        tokens = mask.sum() if batch_num_tokens is None else batch_num_tokens
        if tokens == 0:
            raise ValueError("token-mean over a mask with no 1 entries")
        return masked_sum(loss_mat, mask) / tokens
    tokens_per_seq = mask.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        seq_losses = masked_sum(loss_mat, mask, dim=-1) / (tokens_per_seq + 1e-8)
    else:
        seq_losses = masked_sum(loss_mat, mask, dim=-1)
    live = (tokens_per_seq > 0).to(loss_mat.dtype)  # sequences with at least one counted token
    seqs = live.sum() if global_batch_size is None else global_batch_size
    if seqs == 0:
        raise ValueError(f"{mode} over a mask with no 1 entries")
    loss = (seq_losses * live).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 3.0,
    agg: str = "token-mean",
) -> dict[str, torch.Tensor | float]:
    """PPO's clipped surrogate with an asymmetric clip and the dual clip, as verl's
    `compute_policy_loss_vanilla`.

    ratio = exp(log_prob - old_log_prob), the log-ratio clamped to [-20, 20] first;
    per token  max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)), and for A < 0
    additionally capped at -A * clip_ratio_c (dual clip, arXiv 1912.09729): a token whose ratio
    ran far above 1 with a negative advantage contributes at most |A| * c, not unbounded loss.

    Returns "actor/pg_loss" (a differentiable scalar, aggregated by `agg`) and float metrics:
    "actor/pg_clipfrac" (share of mask-1 tokens where the clipped term won), "actor/ppo_kl"
    (mean of old_log_prob - log_prob over the mask) and "actor/pg_clipfrac_lower" (share where
    the dual-clip cap applied).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.maximum(unclipped, clipped)
    cap = -advantages * clip_ratio_c
    per_token = torch.where(advantages < 0, torch.minimum(surrogate, cap), surrogate)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
        clipfrac_lower = masked_mean(((surrogate > cap) & (advantages < 0)).float(), mask)
        ppo_kl = masked_mean(-log_ratio, mask)
    return {
        "actor/pg_loss": aggregate(per_token, mask, agg),
        "actor/pg_clipfrac": clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": clipfrac_lower.item(),
    }


def value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    agg: str = "token-mean",
) -> dict[str, torch.Tensor | float]:
    """The clipped value loss, as verl's `compute_value_loss`.

    vpreds: the critic's new predictions; values: the predictions at rollout time (old); returns:
    GAE's targets. The clipped prediction stays within values +- cliprange_value; per token the
    larger of the two squared errors counts, and the aggregate is halved:
    0.5 * agg(max((vpreds - R)^2, (clip(vpreds) - R)^2)).

    Returns "critic/vf_loss" (differentiable scalar), "critic/vf_clipfrac" (share of mask-1 tokens
    where the clipped error was the larger) and "critic/vpred_mean".
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value}")
    vpred_clipped = torch.clamp(vpreds, min=values - cliprange_value, max=values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpred_clipped - returns) ** 2
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
        vpred_mean = masked_mean(vpreds, mask)
    return {
        "critic/vf_loss": 0.5 * aggregate(torch.maximum(unclipped, clipped), mask, agg),
        "critic/vf_clipfrac": clipfrac.item(),
        "critic/vpred_mean": vpred_mean.item(),
    }


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs (Schulman 2020):

    k1 ("kl")           log_prob - ref_log_prob: unbiased, high variance, can be negative
    abs                 |log_prob - ref_log_prob|
    mse ("k2")          0.5 * (log_prob - ref_log_prob)^2
    k3 ("low_var_kl")   exp(ref - logp) - (ref - logp) - 1, with ref - logp clamped to [-20, 20]
                        and the result to [-10, 10], as verl does: unbiased, low variance, >= 0

    Usage, as in verl: k1 goes into the reward (use_kl_in_reward: r_t -= beta * k1_t on every
    sampled token, before GAE); k3 is added to the actor loss (use_kl_loss, kl_loss_type
    low_var_kl, aggregated like pg_loss). Here the reward route would put non-zero rewards on
    tokens that are not action tokens, which the protocol counts as violations; KL as a loss
    term keeps every reward on its record's action token. verl's straight-through "k3+" is not
    provided.
    """
    diff = log_prob - ref_log_prob
    if kind in ("k1", "kl"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        log_ratio = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy H = -sum_v p_v log p_v of softmax(logits) over the last axis.

    Computed from log_softmax (stable for large logits) in at least float32. Logits of -inf (tokens
    a grammar masks out) have p = 0 and contribute 0, where verl's logsumexp - sum(p * logits)
    gives NaN (0 * -inf); the clamp keeps that term finite in both the value and the gradient.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p.clamp_min(torch.finfo(log_p.dtype).min)).sum(dim=-1)
