"""How far the trainer's log-probs of the sampled tokens sit from the rollout engine's.

    rollout_drift(trainer_lp, rollout_lp, sampled, raw_lp=None) -> step metrics

Both engines sample each generated token from the grammar-masked distribution, so the rollout's
log-probs are masked ones. The trainer recomputes them under the replayed masks (atlas.rl.ppo;
atlas.verl.actor under verl): `trainer_lp`. `raw_lp`, where the trainer has it, is the same token's
log-prob over the whole vocabulary, what a trainer that ignores the grammar would compute.

    rollout/logprob_gap_mean, _max        |trainer - rollout| log-prob over the sampled tokens
    rollout/importance_ratio_mean         exp(trainer - rollout), masked trainer log-probs
    rollout/importance_ratio_outside      the share of sampled tokens whose ratio is outside
                                          [0.9, 1.1]
    rollout/importance_ratio_raw_mean     the same two with the trainer's raw log-probs
    rollout/importance_ratio_raw_outside

A raw log-prob is never above the masked one (the mask only removes mass), so the raw ratio is at
most the masked one token by token; a forced token (one legal token, masked log-prob 0) has a
raw ratio of its raw probability.
"""

from __future__ import annotations

import torch

RATIO_BAND = (0.9, 1.1)


def rollout_drift(
    trainer_lp: torch.Tensor,
    rollout_lp: torch.Tensor,
    sampled: torch.Tensor,
    raw_lp: torch.Tensor | None = None,
) -> dict[str, float]:
    """The step metrics above over the tokens where `sampled` is 1 ([B, T] tensors alike). An
    empty mask gives no metrics."""
    on = sampled.bool()
    if not bool(on.any()):
        return {}
    rollout = rollout_lp[on].double()
    trainer = trainer_lp[on].double()
    gap = (trainer - rollout).abs()
    out = {"rollout/logprob_gap_max": gap.max().item(), "rollout/logprob_gap_mean": gap.mean().item()}
    trainers = {"importance_ratio": trainer}
    if raw_lp is not None:
        trainers["importance_ratio_raw"] = raw_lp[on].double()
    low, high = RATIO_BAND
    for name, lp in trainers.items():
        ratio = (lp - rollout).exp()
        out[f"rollout/{name}_mean"] = ratio.mean().item()
        out[f"rollout/{name}_outside"] = ((ratio < low) | (ratio > high)).double().mean().item()
    return out
