"""Edges of rl/rewards.py that the hand-worked cases in test_rl_math.py do not reach: the
telescoping tolerance at its boundary and relative to the size of Phi(s_0), float cancellation in
the shaping terms, the exact errors (which record, which episode), an action token at position 0,
an episode without records, and the token rewards' dtype."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from atlas.rl.rewards import (
    PlacedRewards,
    RewardPlacementError,
    ShapingInvariantError,
    check_telescoping,
    shape_episode,
    token_level_rewards,
)
from atlas.runtime.records import ExecutionRecord, write_records


def record(
    turn: int, action_token: int, score: float = 0.0, *, uid: str = "q9", sample: int = 4
) -> ExecutionRecord:
    return ExecutionRecord(
        run="t", step=0, phase="train", question_uid=uid, source="gpqa", sample=sample, turn=turn,
        tool="submit", arguments="{}", action_token=action_token, generation_start=0,
        generated_tokens=1, forced_tokens=0, finish_reason="stop", tool_status="ok",
        tool_output_sha256="", tool_output_excerpt="", sandboxed=True, score=score,
    )  # fmt: skip


@dataclass
class Ep:
    """What a potential and shape_episode read from an episode (rl.potentials.EpisodeLike)."""

    token_ids: list[int]
    loss_mask: list[int]
    sampled: list[int]
    records: list[ExecutionRecord] = field(default_factory=list)


@dataclass
class Fixed:
    values: list[float]

    def __call__(self, episode) -> list[float]:
        return list(self.values)


def all_sampled(n: int, records: list[ExecutionRecord]) -> Ep:
    return Ep(list(range(n)), [1] * n, [1] * n, records)


# --- check_telescoping: the tolerance ---


def test_the_tolerance_is_inclusive():
    # Phi(s_0) = 1, dose 1: expected sum -1. F = [-0.75] is off by exactly tol = 0.25 (binary exact).
    check_telescoping([-0.75], [1.0], gamma=1.0, dose=1.0, tol=0.25)
    with pytest.raises(ShapingInvariantError):
        check_telescoping([-0.625], [1.0], gamma=1.0, dose=1.0, tol=0.25)


def test_the_tolerance_is_relative_to_a_large_expected_sum():
    # expected -100: tol 1e-3 allows 0.1 off (1e-3 * 100), not 0.2
    check_telescoping([-100.0 + 0.09375], [100.0], gamma=1.0, dose=1.0, tol=1e-3)
    with pytest.raises(ShapingInvariantError):
        check_telescoping([-100.0 + 0.1875], [100.0], gamma=1.0, dose=1.0, tol=1e-3)


def test_the_tolerance_is_absolute_below_one():
    # expected -0.5: the scale is max(1, 0.5) = 1, so tol 0.25 allows 0.25 off, not 0.375
    check_telescoping([-0.25], [0.5], gamma=1.0, dose=1.0, tol=0.25)
    with pytest.raises(ShapingInvariantError):
        check_telescoping([-0.125], [0.5], gamma=1.0, dose=1.0, tol=0.25)


def test_the_error_names_the_default_place_and_every_value():
    with pytest.raises(ShapingInvariantError) as err:
        check_telescoping([-0.5, 0.25], [1.0, 0.5], gamma=0.5, dose=2.0)
    assert str(err.value) == (
        "episode: sum_k gamma^k F_k = -0.375, expected -dose * Phi(s_0) = -2.0 "
        "(gamma=0.5, dose=2.0, tol=1e-06, F=[-0.5, 0.25], Phi(s_k)=[1.0, 0.5])"
    )


# --- shape_episode: float cancellation is caught, and the episode is named ---

# Phi = [1, 1e17]: F_0 = 1e17 - 1 rounds to 1e17 (doubles there are 16 apart), F_1 = -1e17, so
# the terms sum to 0 where -Phi(s_0) = -1: a potential this large loses Phi(s_0) entirely.
CANCELLING = [1.0, 1e17]


def test_a_potential_that_cancels_in_floats_is_refused_naming_the_episode():
    ep = all_sampled(4, [record(0, 1), record(1, 3)])
    with pytest.raises(ShapingInvariantError) as err:
        shape_episode(ep, Fixed(CANCELLING), gamma=1.0, dose=1.0)
    assert str(err.value) == (
        "episode (question q9, sample 4): sum_k gamma^k F_k = 0.0, expected -dose * Phi(s_0) = -1.0 "
        "(gamma=1.0, dose=1.0, tol=1e-06, F=[1e+17, -1e+17], Phi(s_k)=[1.0, 1e+17])"
    )


def test_the_tolerance_given_reaches_the_check():
    ep = all_sampled(4, [record(0, 1), record(1, 3)])
    placed = shape_episode(ep, Fixed(CANCELLING), gamma=1.0, dose=1.0, tol=2.0)
    assert placed.shaping == [1e17, -1e17]


def test_a_one_record_episode_is_shaped():
    ep = all_sampled(2, [record(0, 1, uid="q3", sample=0)])
    placed = shape_episode(ep, Fixed([0.5]), gamma=1.0, dose=1.0)
    assert placed.reward == [-0.5] and placed.token_rewards.tolist() == [0.0, -0.5]


def test_an_episode_without_records_gets_no_reward():
    placed = shape_episode(all_sampled(3, []), Fixed([]), gamma=0.9, dose=1.0)
    assert placed.token_rewards.tolist() == [0.0, 0.0, 0.0]
    assert placed.reward == placed.shaping == placed.potential_before == placed.potential_after == []


# --- token_level_rewards: where a reward may go, and the errors ---


def test_a_reward_may_sit_on_position_zero():
    placed = token_level_rewards(3, [record(0, 0, 1.0)], [0.0], [0.0], loss_mask=[1, 1, 1], sampled=[1, 1, 1])
    assert placed.token_rewards.tolist() == [1.0, 0.0, 0.0]


def test_the_token_rewards_are_float32_whatever_the_default_dtype():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        placed = token_level_rewards(2, [record(0, 1, 0.1)], [0.0], [0.0], loss_mask=[1, 1], sampled=[1, 1])
    finally:
        torch.set_default_dtype(default)
    assert placed.token_rewards.dtype == torch.float32
    assert placed.token_rewards.tolist() == [0.0, torch.tensor(0.1, dtype=torch.float32).item()]


@pytest.mark.parametrize(
    "loss_mask, sampled, why",
    [
        ([1, 1], [1, 1, 1], "masks of length 2 (loss_mask) and 3 (sampled), expected 3"),
        ([1, 1, 1], [1, 1], "masks of length 3 (loss_mask) and 2 (sampled), expected 3"),
    ],
)
def test_either_mask_of_the_wrong_length_is_refused(loss_mask, sampled, why):
    with pytest.raises(RewardPlacementError) as err:
        token_level_rewards(3, [record(0, 1)], [0.0], [0.0], loss_mask=loss_mask, sampled=sampled)
    assert str(err.value) == why


def test_counts_that_disagree_are_named():
    with pytest.raises(RewardPlacementError) as err:
        token_level_rewards(3, [record(0, 1)], [0.0, 0.0], [0.0], loss_mask=[1] * 3, sampled=[1] * 3)
    assert str(err.value) == "1 records, 2 shaping terms, 1 potentials"


def test_placement_errors_name_the_record():
    with pytest.raises(RewardPlacementError) as err:
        token_level_rewards(3, [record(2, 1)], [0.0], [0.0], loss_mask=[1, 1, 1], sampled=[1, 0, 1])
    assert str(err.value) == (
        "record (question q9, sample 4, turn 2): action_token 1 has sampled=0, loss_mask=1; "
        "a reward on a forced, prompt or tool token is impossible"
    )
    with pytest.raises(RewardPlacementError) as err:
        token_level_rewards(3, [record(1, 3)], [0.0], [0.0], loss_mask=[1, 1, 1], sampled=[1, 1, 1])
    assert (
        str(err.value)
        == "record (question q9, sample 4, turn 1): action_token 3 outside the trajectory [0, 3)"
    )


# --- PlacedRewards.credits ---


def placed(n: int, before: int) -> PlacedRewards:
    return PlacedRewards(
        token_rewards=torch.zeros(4),
        reward=[0.5] * n,
        shaping=[0.0] * n,
        potential_before=[0.25] * before,
        potential_after=[0.0] * n,
    )


def test_credits_of_another_number_of_records_are_refused(tmp_path):
    with pytest.raises(ValueError) as err:
        write_records(tmp_path / "records.parquet", [record(0, 1)], placed(2, 2).credits())
    assert str(err.value) == "2 credits for 1 records"


def test_credits_refuse_lists_of_different_lengths():
    with pytest.raises(ValueError) as err:
        placed(2, 1).credits()
    assert str(err.value) == "2 rewards, 1 potentials before, 2 after"


# --- shape_episode with the potential's values given ---


def test_given_potential_values_are_used_and_checked():
    ep = all_sampled(4, [record(0, 1), record(1, 3, 1.0)])
    asked = Fixed([9.0, 9.0])  # what the potential would say: not asked when its values are given
    placed = shape_episode(ep, asked, gamma=1.0, dose=1.0, phi=[0.5, 0.25])
    assert placed.potential_before == [0.5, 0.25]
    assert placed.reward == [-0.25, 0.75]
    with pytest.raises(ValueError) as err:
        shape_episode(ep, asked, gamma=1.0, dose=1.0, phi=[0.5])
    assert str(err.value) == (
        "potential Fixed(values=[9.0, 9.0]) returned 1 values for an episode with 2 records; "
        "expected one Phi(s_k) per record"
    )
