"""GAE and whitening at their edges, worked out by hand: the smallest batch whitening accepts, its
epsilon where the variance is tiny, and the errors that name the bad input. (The centre is in
test_rl_math.py; these are the cases a mutation of the edges would slip past.)"""

from __future__ import annotations

import math

import pytest
import torch

from atlas.rl.advantages import gae_over_sampled, gae_over_sampled_batch, masked_whiten

F64 = torch.float64


def test_whitening_two_entries_with_a_tiny_variance():
    # entries 0 and 2e-4: mean 1e-4, unbiased variance (1e-8 + 1e-8) / 1 = 2e-8, so the 1e-8
    # inside the square root matters: +-1e-4 / sqrt(3e-8) = +-0.57735..., not +-0.7071
    out = masked_whiten(torch.tensor([0.0, 2e-4, 5.0], dtype=F64), torch.tensor([1, 1, 0]))
    s = 1e-4 / math.sqrt(3e-8)
    torch.testing.assert_close(out, torch.tensor([-s, s, 0.0], dtype=F64), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match=r"^whitening needs at least 2 mask-1 entries, got 1$"):
        masked_whiten(torch.tensor([1.0, 2.0]), torch.tensor([1, 0]))


def test_a_gap_carries_value_and_advantage_across_it():
    # steps at 0 and 2 (1 is forced): t=2: delta = 1 - 0.5 = 0.5, A = 0.5;
    # t=0: delta = 0 + 0.5 x 0.5 - 0.25 = 0, A = 0 + 0.5 x 0.5 x 0.5 = 0.125 (gamma 0.5, lam 0.5)
    adv, ret = gae_over_sampled(
        torch.tensor([0.0, 0.0, 1.0], dtype=F64),
        torch.tensor([0.25, 7.0, 0.5], dtype=F64),
        torch.tensor([1, 0, 1]),
        0.5,
        0.5,
    )
    torch.testing.assert_close(adv, torch.tensor([0.125, 0.0, 0.5], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(ret, torch.tensor([0.375, 0.0, 1.0], dtype=F64), rtol=0, atol=1e-15)


def test_gae_errors_name_the_shapes_and_the_stray_reward():
    with pytest.raises(
        ValueError,
        match=r"^rewards \(1, 3\), values \(1, 2\) and sampled_mask \(1, 3\) must be one \[B, T\] shape$",
    ):
        gae_over_sampled_batch(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 3), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"must be one \[B, T\] shape"):
        gae_over_sampled_batch(torch.zeros(3), torch.zeros(3), torch.ones(3), 1.0, 1.0)
    with pytest.raises(
        ValueError,
        match=r"^2 non-zero rewards on non-sampled tokens \(first: row 1, position 0, reward -1.5\); "
        r"rewards belong on action tokens$",
    ):
        gae_over_sampled_batch(
            torch.tensor([[0.0, 0.0], [-1.5, 2.0]]),
            torch.zeros(2, 2),
            torch.tensor([[1, 1], [0, 0]]),
            1.0,
            1.0,
        )
    with pytest.raises(ValueError, match=r"^one trajectory is a 1-D tensor, got shape \(1, 2\)$"):
        gae_over_sampled(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 1.0, 1.0)


def test_a_one_token_trajectory():
    # T = 1: A = r - V, R = r
    adv, ret = gae_over_sampled(
        torch.tensor([1.0], dtype=F64), torch.tensor([0.25], dtype=F64), torch.tensor([1]), 0.9, 0.9
    )
    assert (adv.tolist(), ret.tolist()) == ([0.75], [1.0])
