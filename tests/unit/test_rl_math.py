"""The training stage's RL math on hand-worked numbers, and against verl 0.9.1 where it is installed.

Every expected value below is written out with its arithmetic, so a failing test says which rule
broke. The verl comparison skips where verl is not installed (the project's own venv).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import math
import os

import pytest
import torch

from atlas.rl.advantages import gae_over_sampled, gae_over_sampled_batch, masked_whiten
from atlas.rl.losses import (
    AGG_MODES,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    value_loss,
)
from atlas.rl.potentials import (
    ZeroPotential,
    evaluate_potential,
    make_potential,
    register_potential,
    registered_potentials,
)
from atlas.rl.rewards import (
    RewardPlacementError,
    ShapingInvariantError,
    check_telescoping,
    shape_episode,
    shaping_terms,
    token_level_rewards,
)
from atlas.runtime.records import ExecutionRecord

F64 = torch.float64


def record(turn: int, action_token: int, score: float) -> ExecutionRecord:
    return ExecutionRecord(
        run="t",
        step=0,
        phase="train",
        question_uid="q0",
        source="gpqa",
        sample=0,
        turn=turn,
        tool="submit",
        arguments="{}",
        action_token=action_token,
        generation_start=0,
        generated_tokens=1,
        forced_tokens=0,
        finish_reason="stop",
        tool_status="ok",
        tool_output_sha256="",
        tool_output_excerpt="",
        sandboxed=True,
        score=score,
    )


def two_turn_episode():
    """A real Episode, masks made by its own add_generation / add_tool_response:

    position   0 1 2 | 3 4 5 6 | 7 8 | 9 10 11
    part       prompt| gen 0   | tool| gen 1
    loss_mask  0 0 0 | 1 1 1 1 | 0 0 | 1 1  1
    sampled    0 0 0 | 1 1 1 0 | 0 0 | 1 0  0     (6, 10, 11 forced by the grammar)
    action tokens: 5 (gen 0's last sampled token) and 9 (gen 1's)
    """
    from atlas.runtime.engine import Generation
    from atlas.runtime.episode import Episode

    ep = Episode(
        question={"question_uid": "q0", "source": "gpqa"},
        tests=[],
        sample=0,
        script=None,
        tools={},
        token_ids=[100, 101, 102],
        prompt_tokens=3,
        loss_mask=[0, 0, 0],
        sampled=[0, 0, 0],
        logprobs=[0.0, 0.0, 0.0],
    )
    gen0 = Generation([10, 11, 12, 13], [-0.5, -0.4, -0.3, 0.0], [1, 1, 1, 0], "stop")
    ep.add_generation(gen0, {}, 8, frozenset({13}))
    ep.add_tool_response([200, 201])
    gen1 = Generation([20, 21, 13], [-0.2, 0.0, 0.0], [1, 0, 0], "stop")
    ep.add_generation(gen1, {}, 8, frozenset({13}))
    ep.records = [record(0, 5, 0.0), record(1, 9, 1.0)]
    return ep


# ---------------------------------------------------------------- potentials and shaping


def test_zero_potential_and_registry():
    ep = two_turn_episode()
    assert make_potential("zero")(ep) == [0.0, 0.0]
    assert isinstance(make_potential("zero"), ZeroPotential)
    assert repr(make_potential("zero")) == "ZeroPotential()"
    with pytest.raises(KeyError, match="registered: .*'zero'"):
        make_potential("frozen_critic_not_registered")

    @register_potential("test_rl_math_fixed")
    class Fixed:
        def __init__(self, values: list[float]):
            self.values = values

        def __call__(self, episode) -> list[float]:
            return list(self.values)

    assert "test_rl_math_fixed" in registered_potentials()
    assert make_potential("test_rl_math_fixed", values=[0.4, 0.3])(ep) == [0.4, 0.3]
    with pytest.raises(ValueError, match="already registered"):
        register_potential("test_rl_math_fixed")(ZeroPotential)
    with pytest.raises(ValueError, match="potential <.*Fixed object at .*> returned 1 values .* 2 records"):
        evaluate_potential(Fixed([0.4]), ep)
    with pytest.raises(ValueError, match="non-finite"):
        evaluate_potential(Fixed([0.4, math.nan]), ep)


def test_shaping_terms_gamma_one():
    # Phi(s_0..s_2) = 2, 1, 0.5 and Phi(terminal) = 0; dose 1, gamma 1:
    # F = [1 - 2, 0.5 - 1, 0 - 0.5] = [-1, -0.5, -0.5]; the sum is -2 = -Phi(s_0).
    phi = [2.0, 1.0, 0.5]
    F = shaping_terms(phi, gamma=1.0, dose=1.0)
    assert F == pytest.approx([-1.0, -0.5, -0.5], abs=1e-12)
    check_telescoping(F, phi, gamma=1.0, dose=1.0)


def test_shaping_terms_gamma_point_nine_with_dose():
    # dose 0.5, gamma 0.9:
    # F_0 = 0.5 * (0.9 * 1.0 - 2.0) = -0.55
    # F_1 = 0.5 * (0.9 * 0.5 - 1.0) = -0.275
    # F_2 = 0.5 * (0.9 * 0.0 - 0.5) = -0.25
    # sum gamma^k F_k = -0.55 - 0.9 * 0.275 - 0.81 * 0.25 = -0.55 - 0.2475 - 0.2025 = -1.0 = -0.5 * 2.0
    phi = [2.0, 1.0, 0.5]
    F = shaping_terms(phi, gamma=0.9, dose=0.5)
    assert F == pytest.approx([-0.55, -0.275, -0.25], abs=1e-12)
    check_telescoping(F, phi, gamma=0.9, dose=0.5)
    # The same terms do not telescope under another discount.
    with pytest.raises(ShapingInvariantError):
        check_telescoping(F, phi, gamma=1.0, dose=0.5)


def test_telescoping_check_raises_on_tampered_terms():
    phi = [2.0, 1.0, 0.5]
    F = shaping_terms(phi, gamma=0.9, dose=0.5)
    F[1] += 0.1
    with pytest.raises(ShapingInvariantError, match=r"q7.*expected -dose \* Phi\(s_0\) = -1\.0") as err:
        check_telescoping(F, phi, gamma=0.9, dose=0.5, where="episode q7")
    assert isinstance(err.value, AssertionError)
    assert "Phi(s_k)=[2.0, 1.0, 0.5]" in str(err.value)
    with pytest.raises(ShapingInvariantError):
        check_telescoping([math.nan, 0.0, 0.0], phi, gamma=0.9, dose=0.5)
    with pytest.raises(ShapingInvariantError, match="2 shaping terms for 3 potentials"):
        check_telescoping(F[:2], phi, gamma=0.9, dose=0.5)
    check_telescoping([], [], gamma=0.9, dose=0.5)  # no records: nothing to telescope


# ---------------------------------------------------------------- rewards on action tokens


def test_rewards_land_exactly_on_action_tokens():
    ep = two_turn_episode()

    class Fixed:
        def __call__(self, episode) -> list[float]:
            return [0.4, 0.3]

    # gamma 1, dose 1: F_0 = 0.3 - 0.4 = -0.1, F_1 = 0 - 0.3 = -0.3
    # reward_0 = 0.0 - 0.1 = -0.1 on position 5; reward_1 = 1.0 - 0.3 = 0.7 on position 9
    placed = shape_episode(ep, Fixed(), gamma=1.0, dose=1.0)
    expected = torch.zeros(12, dtype=torch.float32)
    expected[5], expected[9] = -0.1, 0.7
    assert placed.token_rewards.dtype == torch.float32
    assert torch.equal(placed.token_rewards, expected)
    assert placed.token_rewards.nonzero().flatten().tolist() == [5, 9]
    assert placed.shaping == pytest.approx([-0.1, -0.3])
    assert placed.reward == pytest.approx([-0.1, 0.7])
    assert placed.potential_before == [0.4, 0.3]
    assert placed.potential_after == [0.3, 0.0]

    credits = placed.credits()
    assert [c.reward for c in credits] == pytest.approx([-0.1, 0.7])
    assert [(c.potential_before, c.potential_after) for c in credits] == [(0.4, 0.3), (0.3, 0.0)]
    assert [(c.value, c.advantage) for c in credits] == [(None, None)] * 2  # after GAE

    # The runtime's protocol view of the episode, given the credits, agrees with the placed tensor.
    from atlas.runtime.protocol import token_rewards

    assert token_rewards(ep, credits) == pytest.approx(placed.token_rewards.tolist())


def test_zero_potential_rewards_are_the_scores():
    ep = two_turn_episode()
    placed = shape_episode(ep, make_potential("zero"), gamma=0.9, dose=2.0)
    assert placed.shaping == [0.0, 0.0]
    assert placed.token_rewards.nonzero().flatten().tolist() == [9]
    assert placed.token_rewards[9].item() == 1.0


@pytest.mark.parametrize(
    ("action_token", "why"),
    [
        (6, "action_token 6 has sampled=0, loss_mask=1"),  # forced stop token of gen 0
        (10, "action_token 10 has sampled=0, loss_mask=1"),  # forced token of gen 1
        (7, "action_token 7 has sampled=0, loss_mask=0"),  # tool output
        (1, "action_token 1 has sampled=0, loss_mask=0"),  # prompt
        (12, r"action_token 12 outside the trajectory \[0, 12\)"),
        (-1, r"action_token -1 outside the trajectory"),
    ],
)
def test_reward_on_a_masked_token_is_refused(action_token, why):
    ep = two_turn_episode()
    ep.records[1] = dataclasses.replace(ep.records[1], action_token=action_token)
    with pytest.raises(RewardPlacementError, match=why):
        shape_episode(ep, make_potential("zero"), gamma=1.0, dose=1.0)


def test_two_records_on_one_action_token_are_refused():
    ep = two_turn_episode()
    with pytest.raises(RewardPlacementError, match="action_token 5 is also turn 0's"):
        token_level_rewards(
            12,
            [record(0, 5, 0.0), record(1, 5, 1.0)],
            [0.0, 0.0],
            [0.0, 0.0],
            loss_mask=ep.loss_mask,
            sampled=ep.sampled,
        )
    with pytest.raises(RewardPlacementError, match="masks of length 12"):
        token_level_rewards(
            13, ep.records, [0.0, 0.0], [0.0, 0.0], loss_mask=ep.loss_mask, sampled=ep.sampled
        )


# ---------------------------------------------------------------- GAE over sampled tokens


def test_gae_skips_non_sampled_tokens_hand_worked():
    # position   0  1    2    3  4  5    6  7
    # sampled    0  1    1    0  0  1    0  1
    # reward     0  0    1    0  0  0    0  2
    # value      9  0.5  0.2  9  9  0.4  9  0.1     (9s sit on non-steps: they must not matter)
    sampled = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1])
    rewards = torch.tensor([0, 0, 1, 0, 0, 0, 0, 2], dtype=F64)
    values = torch.tensor([9, 0.5, 0.2, 9, 9, 0.4, 9, 0.1], dtype=F64)
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    # t=7: delta = 2 + 0.9*0   - 0.1 =  1.9;   A = 1.9
    # t=5: delta = 0 + 0.9*0.1 - 0.4 = -0.31;  A = -0.31 + 0.72*1.9    = 1.058
    # t=2: delta = 1 + 0.9*0.4 - 0.2 =  1.16;  A = 1.16  + 0.72*1.058  = 1.92176
    # t=1: delta = 0 + 0.9*0.2 - 0.5 = -0.32;  A = -0.32 + 0.72*1.92176 = 1.0636672
    adv, ret = gae_over_sampled(rewards, values, sampled, gamma, lam)
    expected_adv = torch.tensor([0, 1.0636672, 1.92176, 0, 0, 1.058, 0, 1.9], dtype=F64)
    # returns = A + V on steps: 1.0636672+0.5, 1.92176+0.2, 1.058+0.4, 1.9+0.1
    expected_ret = torch.tensor([0, 1.5636672, 2.12176, 0, 0, 1.458, 0, 2.0], dtype=F64)
    torch.testing.assert_close(adv, expected_adv, rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, expected_ret, rtol=0, atol=1e-12)

    # The same GAE on the compacted (sampled-only) sequence gives the same numbers.
    steps = sampled.bool()
    c_adv, c_ret = gae_over_sampled(rewards[steps], values[steps], torch.ones(4), gamma, lam)
    torch.testing.assert_close(c_adv, adv[steps], rtol=0, atol=1e-12)
    torch.testing.assert_close(c_ret, ret[steps], rtol=0, atol=1e-12)


def test_gae_with_gamma_lam_one_and_zero_values_is_reward_to_go():
    g = torch.Generator().manual_seed(1)
    sampled = (torch.rand(40, generator=g) < 0.5).long()
    rewards = torch.randn(40, generator=g, dtype=F64) * sampled
    adv, ret = gae_over_sampled(rewards, torch.zeros(40, dtype=F64), sampled, 1.0, 1.0)
    for t in range(40):
        expected = rewards[t:].sum().item() if sampled[t] else 0.0
        assert adv[t].item() == pytest.approx(expected, abs=1e-12), t
    torch.testing.assert_close(ret, adv)


def test_gae_refuses_a_reward_on_a_non_sampled_token():
    with pytest.raises(ValueError, match="row 0, position 2, reward 1.0"):
        gae_over_sampled(torch.tensor([0.0, 0.0, 1.0]), torch.zeros(3), torch.tensor([1, 1, 0]), 1.0, 1.0)


def test_batched_gae_equals_per_row_on_a_ragged_batch():
    g = torch.Generator().manual_seed(2)
    B, T = 5, 23
    lengths = [23, 17, 9, 1, 0]
    sampled = (torch.rand(B, T, generator=g) < 0.7).long()
    for b, n in enumerate(lengths):
        sampled[b, n:] = 0  # padding
    rewards = torch.randn(B, T, generator=g) * sampled
    values = torch.randn(B, T, generator=g)
    adv, ret = gae_over_sampled_batch(rewards, values, sampled, 0.95, 0.9)
    for b in range(B):
        a, r = gae_over_sampled(rewards[b], values[b], sampled[b], 0.95, 0.9)
        torch.testing.assert_close(adv[b], a, rtol=0, atol=0)
        torch.testing.assert_close(ret[b], r, rtol=0, atol=0)
    assert adv[sampled == 0].abs().sum() == 0 and ret[sampled == 0].abs().sum() == 0

    white, _ = gae_over_sampled_batch(rewards, values, sampled, 0.95, 0.9, whiten=True)
    steps = sampled.bool()
    assert white[steps].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert white[steps].std().item() == pytest.approx(1.0, abs=1e-5)  # unbiased, as the whitening
    assert white[~steps].abs().sum() == 0


def test_masked_whiten_hand_values():
    # over mask-1 entries 1, 2, 3: mean 2, unbiased variance ((-1)^2 + 0 + 1^2) / (3 - 1) = 1
    x = torch.tensor([1.0, 2.0, 3.0, 100.0], dtype=F64)
    mask = torch.tensor([1, 1, 1, 0])
    scale = 1 / math.sqrt(1 + 1e-8)
    torch.testing.assert_close(masked_whiten(x, mask), torch.tensor([-scale, 0, scale, 0], dtype=F64))
    torch.testing.assert_close(
        masked_whiten(x, mask, keep_mean=True), torch.tensor([2 - scale, 2, 2 + scale, 0], dtype=F64)
    )
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(x, torch.tensor([0, 1, 0, 0]))


# ---------------------------------------------------------------- losses


def test_policy_loss_hand_values():
    # clip [1 - 0.2, 1 + 0.28] = [0.8, 1.28], dual clip c = 3
    # token  ratio  A    -A*ratio  -A*clip(ratio)  max     dual cap -A*c  loss
    # a      1.1    1    -1.1      -1.1            -1.1    -              -1.1   (inside the clip)
    # b      1.5    2    -3.0      -2.56           -2.56   -              -2.56  (above 1.28, A > 0)
    # c      0.5   -1     0.5       0.8             0.8    3              0.8    (below 0.8, A < 0)
    # d      5.0   -1     5.0       1.28            5.0    3              3.0    (dual clip caps it)
    ratio = torch.tensor([[1.1, 1.5, 0.5, 5.0]], dtype=F64)
    adv = torch.tensor([[1.0, 2.0, -1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 4, dtype=F64)
    out = policy_loss(ratio.log(), torch.zeros(1, 4, dtype=F64), adv, mask, 0.2, 0.28, 3.0)
    assert out["actor/pg_loss"].item() == pytest.approx((-1.1 - 2.56 + 0.8 + 3.0) / 4, abs=1e-12)
    assert out["actor/pg_clipfrac"] == pytest.approx(2 / 4)  # b and c: the clipped term won
    assert out["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)  # d: the dual-clip cap applied
    # ppo_kl = mean(old - new) = -(log 1.1 + log 1.5 + log 0.5 + log 5) / 4 = -log(4.125) / 4
    assert out["actor/ppo_kl"] == pytest.approx(-math.log(4.125) / 4, abs=1e-12)

    # Token-by-token: masking all but one token leaves that token's loss.
    for i, loss in enumerate([-1.1, -2.56, 0.8, 3.0]):
        one = torch.zeros(1, 4, dtype=F64)
        one[0, i] = 1
        single = policy_loss(ratio.log(), torch.zeros(1, 4, dtype=F64), adv, one, 0.2, 0.28, 3.0)
        assert single["actor/pg_loss"].item() == pytest.approx(loss, abs=1e-12), i
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(ratio.log(), ratio.log(), adv, mask, 0.2, 0.2, clip_ratio_c=1.0)


def test_policy_loss_gradients_only_where_the_mask_is_one():
    log_prob = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.1, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.05, -1.95, -0.4], [-1.45, -0.2, -2.0]])  # ratios inside [0.8, 1.28]
    adv = torch.tensor([[1.0, -2.0, 0.5], [0.7, 1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    for agg in AGG_MODES:
        log_prob.grad = None
        policy_loss(log_prob, old, adv, mask, 0.2, 0.28, agg=agg)["actor/pg_loss"].backward()
        grad = log_prob.grad
        assert grad is not None
        assert (grad[mask == 0] == 0).all(), agg
        assert (grad[mask == 1] != 0).all(), agg
    # token-mean: d/dlogp of -A * ratio / 3 tokens = -A * ratio / 3
    log_prob.grad = None
    policy_loss(log_prob, old, adv, mask, 0.2, 0.28)["actor/pg_loss"].backward()
    expected = -adv * torch.exp(log_prob.detach() - old) / 3 * mask
    torch.testing.assert_close(log_prob.grad, expected)


def test_value_loss_clipping_hand_values():
    # old values 1, clip range 0.2: the clipped prediction stays in [0.8, 1.2]
    # token  R  vpred  clipped  (vpred-R)^2  (clipped-R)^2  max
    # 0      2  1.1    1.1      0.81         0.81           0.81   (inside the range)
    # 1      2  2.5    1.2      0.25         0.64           0.64   (clipped error larger: counted)
    # 2      0  1.5    1.2      2.25         1.44           2.25
    values = torch.ones(1, 3, dtype=F64)
    returns = torch.tensor([[2.0, 2.0, 0.0]], dtype=F64)
    vpreds = torch.tensor([[1.1, 2.5, 1.5]], dtype=F64, requires_grad=True)
    out = value_loss(vpreds, values, returns, torch.ones(1, 3, dtype=F64), 0.2)
    assert out["critic/vf_loss"].item() == pytest.approx(0.5 * (0.81 + 0.64 + 2.25) / 3, abs=1e-12)
    assert out["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    assert out["critic/vpred_mean"] == pytest.approx((1.1 + 2.5 + 1.5) / 3)
    out["critic/vf_loss"].backward()
    # token 1's loss is the clipped one: no gradient reaches its prediction
    # token 0: 0.5 * 2 * (1.1 - 2) / 3 = -0.3; token 2: 0.5 * 2 * (1.5 - 0) / 3 = 0.5
    torch.testing.assert_close(vpreds.grad, torch.tensor([[-0.3, 0.0, 0.5]], dtype=F64))


def test_aggregation_modes_on_a_ragged_mask():
    loss = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, math.nan, 9, 9]], dtype=F64)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=F64)
    # token-mean: (1 + 2 + 3 + 5) / 4 tokens
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(11 / 4)
    # seq-mean-token-sum: row sums 6 and 5; the fully masked row is not a sequence
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 5) / 2)
    # seq-mean-token-mean: row means 6 / 3 = 2 and 5 / 1 = 5
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 5) / 2, abs=1e-6)
    # seq-mean-token-sum-norm: seq-mean-token-sum / T (T = 4 columns), or / a fixed constant
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5.5 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=11).item() == pytest.approx(0.5)
    # global counts for micro-batches
    assert aggregate(loss, mask, "token-mean", batch_num_tokens=8).item() == pytest.approx(11 / 8)
    assert aggregate(loss, mask, "seq-mean-token-sum", global_batch_size=4).item() == pytest.approx(11 / 4)
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'token-sum'"):
        aggregate(loss, mask, "token-sum")
    with pytest.raises(ValueError, match="no 1 entries"):
        aggregate(loss, torch.zeros_like(mask), "seq-mean-token-mean")


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0], dtype=F64)
    ref = torch.tensor([-1.5, -1.0], dtype=F64)
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([0.5, -1.0], dtype=F64))
    torch.testing.assert_close(kl_penalty(logp, ref, "abs"), torch.tensor([0.5, 1.0], dtype=F64))
    # mse = k2 = 0.5 * diff^2
    torch.testing.assert_close(kl_penalty(logp, ref, "mse"), torch.tensor([0.125, 0.5], dtype=F64))
    # k3: d = ref - logp = [-0.5, 1.0]; exp(d) - d - 1 = [e^-0.5 - 0.5, e - 2]
    k3 = torch.tensor([math.exp(-0.5) - 0.5, math.e - 2], dtype=F64)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), k3)
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), k3)
    # clamps: d = -30 -> -20 -> e^-20 + 19, clamped to 10; d = 30 -> 20 -> e^20 - 21, clamped to 10
    far = kl_penalty(torch.tensor([0.0, -30.0]), torch.tensor([-30.0, 0.0]), "k3")
    assert far.tolist() == [10.0, 10.0]
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_entropy_and_masked_mean():
    V = 7
    uniform = entropy_from_logits(torch.zeros(2, 5, V))
    torch.testing.assert_close(uniform, torch.full((2, 5), math.log(V)))
    torch.testing.assert_close(entropy_from_logits(torch.full((3, V), 1000.0)), torch.full((3,), math.log(V)))
    # p = softmax([0, log 3]) = [1/4, 3/4]
    two = entropy_from_logits(torch.tensor([0.0, math.log(3)], dtype=F64))
    assert two.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-12)
    # grammar-masked logits (-inf) count as p = 0: finite entropy and gradients
    logits = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert entropy_from_logits(torch.zeros(4, dtype=torch.bfloat16)).dtype == torch.float32

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert masked_mean(x, mask).item() == pytest.approx(8 / 3)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.0, 3.5]))
    with pytest.raises(ValueError, match="empty mask"):
        masked_mean(x, torch.zeros_like(mask))


# ---------------------------------------------------------------- against verl 0.9.1


def ragged_batch(seed: int, B: int = 6, T: int = 29):
    """Random rewards, values and a sampled mask with gaps, ragged padding and one empty row."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.6).float()
    for b, n in enumerate([29, 25, 16, 7, 2, 0][:B]):
        mask[b, n:] = 0
    rewards = torch.where(torch.rand(B, T, generator=g) < 0.3, torch.randn(B, T, generator=g), 0.0) * mask
    values = torch.randn(B, T, generator=g)  # also at non-steps, where both must ignore them
    return g, mask, rewards, values


def _verl(module: str):
    """verl's module; a skip without verl, unless ATLAS_REQUIRE_VERL is set (CI's verl venv)."""
    if os.environ.get("ATLAS_REQUIRE_VERL"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.mark.verl
def test_matches_verl_0_9_1():
    core = _verl("verl.trainer.ppo.core_algos")
    verl_F = _verl("verl.utils.torch_functional")
    assert importlib.metadata.version("verl") == "0.9.1"
    from verl.workers.config.actor import ActorConfig

    g, mask, rewards, values = ragged_batch(seed=0)
    steps = mask.bool()
    gamma, lam = 0.97, 0.93

    # GAE with verl's whitening, and the unwhitened advantages behind verl's returns.
    v_adv, v_ret = core.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    adv, ret = gae_over_sampled_batch(rewards, values, mask, gamma, lam, whiten=True)
    raw, _ = gae_over_sampled_batch(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv[steps], v_adv[steps], rtol=0, atol=1e-6)
    torch.testing.assert_close(ret[steps], v_ret[steps], rtol=0, atol=1e-6)
    torch.testing.assert_close(raw[steps], (v_ret - values)[steps], rtol=0, atol=1e-6)
    # The documented corner: verl carries the next step's advantage through non-steps; ours is 0.
    assert (adv[~steps] == 0).all() and (ret[~steps] == 0).all()
    inside = torch.zeros_like(steps)
    inside[0, : int(steps[0].nonzero().max())] = True  # row 0 up to its last step
    gap = inside & ~steps
    assert gap.any() and (v_ret - values)[gap].abs().sum() > 0

    loss_mat = torch.randn(*mask.shape, generator=g)
    for mode in AGG_MODES:
        ours = aggregate(loss_mat, mask, mode)
        torch.testing.assert_close(ours, core.agg_loss(loss_mat, mask, mode), rtol=0, atol=1e-6)

    # Policy loss: ratios spread across and beyond the clip, advantages of both signs.
    old = -torch.rand(*mask.shape, generator=g) * 3
    log_prob = old + torch.randn(*mask.shape, generator=g)  # log-ratios ~ N(0, 1): some past c = 3
    for mode in AGG_MODES:
        config = ActorConfig(
            strategy="fsdp2",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=3.0,
            loss_agg_mode=mode,
        )
        v_loss, v_metrics = core.compute_policy_loss_vanilla(
            old_log_prob=old,
            log_prob=log_prob,
            advantages=adv,
            response_mask=steps,
            loss_agg_mode=mode,
            config=config,
        )
        out = policy_loss(log_prob, old, adv, mask, 0.2, 0.28, 3.0, agg=mode)
        torch.testing.assert_close(out["actor/pg_loss"], v_loss, rtol=0, atol=1e-6)
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert out[key] == pytest.approx(v_metrics[key], abs=1e-6), (mode, key)
    assert 0 < out["actor/pg_clipfrac"] < 1 and out["actor/pg_clipfrac_lower"] > 0

    # Value loss: predictions near and beyond the clip range.
    vpreds = values + torch.randn(*mask.shape, generator=g) * 0.5
    for mode in AGG_MODES:
        v_loss, v_clipfrac = core.compute_value_loss(
            vpreds=vpreds,
            returns=ret,
            values=values,
            response_mask=steps,
            cliprange_value=0.3,
            loss_agg_mode=mode,
        )
        out = value_loss(vpreds, values, ret, mask, 0.3, agg=mode)
        torch.testing.assert_close(out["critic/vf_loss"], v_loss, rtol=0, atol=1e-6)
        assert out["critic/vf_clipfrac"] == pytest.approx(v_clipfrac.item(), abs=1e-6)
    assert 0 < out["critic/vf_clipfrac"] < 1

    ref = old + torch.randn(*mask.shape, generator=g) * 0.3
    for kind in ("k1", "abs", "mse", "k3", "low_var_kl"):
        torch.testing.assert_close(
            kl_penalty(log_prob, ref, kind), core.kl_penalty(log_prob, ref, kind), rtol=0, atol=1e-6
        )
    logits = torch.randn(4, 9, 50, generator=g) * 3
    torch.testing.assert_close(
        entropy_from_logits(logits), verl_F.entropy_from_logits(logits), rtol=0, atol=1e-5
    )
