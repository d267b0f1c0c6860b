"""The PPO losses at their edges, worked out by hand: the clamps of the log-ratio, the dual clip's
default and its counting, the value clip on both sides, the KL estimators' names and their
gradients far from the reference, and the errors that name what was wrong. (The centre of each
loss is in test_rl_math.py; these are the cases a mutation of the edges would slip past.)"""

from __future__ import annotations

import math

import pytest
import torch

from atlas.rl.losses import aggregate, kl_penalty, masked_mean, policy_loss, value_loss

ONE = torch.ones(1, 1)


def t(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float64)


def test_the_log_ratio_is_clamped_to_twenty_both_ways():
    old = t(0.0, 0.0)
    # log_prob - old = +30 and -30: ppo_kl is the mean of -log_ratio over the clamped values
    out = policy_loss(t(30.0, -30.0), old, t(1.0, 1.0), torch.ones(1, 2), 0.2, 0.2)
    assert out["actor/ppo_kl"] == 0.0  # -20 and +20
    out = policy_loss(t(30.0), t(0.0), t(1.0), ONE, 0.2, 0.2)
    assert out["actor/ppo_kl"] == -20.0
    out = policy_loss(t(-30.0), t(0.0), t(1.0), ONE, 0.2, 0.2)
    assert out["actor/ppo_kl"] == 20.0


def test_dual_clip_default_and_bound():
    # A = -2 and a ratio of e^5: the surrogate 2 e^5 is capped at |A| x 3 (verl's default c)
    out = policy_loss(t(5.0), t(0.0), t(-2.0), ONE, 0.2, 0.2)
    assert out["actor/pg_loss"].item() == 6.0 and out["actor/pg_clipfrac_lower"] == 1.0
    assert (
        policy_loss(t(5.0), t(0.0), t(-2.0), ONE, 0.2, 0.2, clip_ratio_c=1.5)["actor/pg_loss"].item() == 3.0
    )
    with pytest.raises(ValueError, match=r"clip_ratio_c must be > 1 for the dual clip, got 1.0"):
        policy_loss(t(5.0), t(0.0), t(-2.0), ONE, 0.2, 0.2, clip_ratio_c=1.0)


def test_the_dual_clip_counts_only_negative_advantages():
    # positive advantages below 1 are never capped: pg_clipfrac_lower counts the A < 0 token only
    out = policy_loss(t(5.0, 0.0, 0.0), t(0.0, 0.0, 0.0), t(-2.0, 0.5, 0.25), torch.ones(1, 3), 0.2, 0.2)
    assert out["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3, abs=1e-6)


def test_value_clip_on_both_sides():
    values, c = t(0.0), 1.0
    # below: the clipped prediction is values - c = -1, its error to R = -10 is 81 > 25
    out = value_loss(t(-5.0), values, t(-10.0), ONE, c)
    assert (out["critic/vf_loss"].item(), out["critic/vf_clipfrac"]) == (0.5 * 81.0, 1.0)
    # inside the range nothing is clipped: vpreds = values, R = -1, both errors 1
    out = value_loss(t(0.0), values, t(-1.0), ONE, 0.5)
    assert (out["critic/vf_loss"].item(), out["critic/vf_clipfrac"]) == (0.5, 0.0)
    # a clip range of 0 is allowed: the clipped prediction is the old value itself
    out = value_loss(t(0.5), values, t(0.0), ONE, 0.0)
    assert (out["critic/vf_loss"].item(), out["critic/vf_clipfrac"]) == (0.125, 0.0)


def test_kl_estimator_names_and_far_gradients():
    logp, ref = t(-1.0, -3.0), t(-2.0, -2.0)
    assert torch.equal(kl_penalty(logp, ref, "kl"), kl_penalty(logp, ref, "k1"))
    assert torch.equal(kl_penalty(logp, ref, "k2"), t(0.5, 0.5))
    assert torch.equal(kl_penalty(logp, ref, "low_var_kl"), kl_penalty(logp, ref, "k3"))
    # k3 far from the reference: capped at 10, and its gradient stays finite (exp(1000) = inf
    # would make it NaN without the log-ratio clamp)
    far = torch.tensor([[-1000.0]], dtype=torch.float64, requires_grad=True)
    k3 = kl_penalty(far, torch.zeros(1, 1, dtype=torch.float64), "k3")
    k3.sum().backward()
    assert k3.item() == 10.0 and far.grad.item() == 0.0
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; expected one of \('k1', 'kl'"):
        kl_penalty(logp, ref, "k4")


def test_seq_mean_token_mean_uses_verls_epsilon():
    loss, mask = t(1.0, 2.0, 4.0), t(1.0, 1.0, 0.0)
    got = aggregate(loss, mask, "seq-mean-token-mean").item()
    assert got == 3.0 / (2.0 + 1e-8) and got != 1.5


def test_errors_name_what_was_wrong():
    with pytest.raises(ValueError, match=r"^loss \(1, 2\) and mask \(1, 3\) differ in shape$"):
        aggregate(torch.ones(1, 2), torch.ones(1, 3), "token-mean")
    with pytest.raises(ValueError, match=r"^token-mean over a mask with no 1 entries$"):
        aggregate(torch.ones(1, 2), torch.zeros(1, 2), "token-mean")
    with pytest.raises(ValueError, match=r"^seq-mean-token-sum over a mask with no 1 entries$"):
        aggregate(torch.ones(1, 2), torch.zeros(1, 2), "seq-mean-token-sum")
    with pytest.raises(ValueError, match=r"^masked_mean over an empty mask$"):
        masked_mean(torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"^cliprange_value must be >= 0, got -0.5$"):
        value_loss(t(0.0), t(0.0), t(0.0), ONE, -0.5)
    assert not math.isnan(masked_mean(torch.tensor([float("nan"), 2.0]), torch.tensor([0.0, 1.0])).item())
