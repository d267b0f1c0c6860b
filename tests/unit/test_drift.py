"""The rollout-vs-trainer drift metrics (atlas.rl.drift) and the raw log-probs they compare
against (atlas.rl.ppo.Passes.old_logprobs), on hand-made tensors and a tiny random Qwen3 (CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from atlas.config.training import PPOConfig, TrainingConfig
from atlas.model.policy import ActorCritic
from atlas.rl.drift import rollout_drift
from atlas.rl.ppo import Batch, Passes, forward_passes, prepare
from atlas.rl.replay import ReplayedMasks
from tests.unit.test_packing import padded_batch, random_bitmask, tiny_lm


def test_drift_metrics_of_known_ratios():
    # sampled tokens: ratios 1.0, 1.05, 0.85, 1.2 (masked) and 0.5 each (raw); one unsampled
    # token with a huge gap counts nowhere
    rollout = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    masked = rollout + torch.log(torch.tensor([[1.0, 1.05, 0.85, 1.2, 50.0]]))
    raw = rollout + math.log(0.5)
    sampled = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    m = rollout_drift(masked, rollout, sampled, raw)
    assert m["rollout/importance_ratio_mean"] == pytest.approx((1.0 + 1.05 + 0.85 + 1.2) / 4)
    assert m["rollout/importance_ratio_outside"] == pytest.approx(0.5)  # 0.85 and 1.2
    assert m["rollout/importance_ratio_raw_mean"] == pytest.approx(0.5)
    assert m["rollout/importance_ratio_raw_outside"] == pytest.approx(1.0)
    assert m["rollout/logprob_gap_max"] == pytest.approx(math.log(1.2))
    gaps = [0.0, math.log(1.05), -math.log(0.85), math.log(1.2)]
    assert m["rollout/logprob_gap_mean"] == pytest.approx(sum(gaps) / 4)


def test_drift_band_is_0_9_to_1_1_and_raw_is_optional():
    rollout = torch.zeros(1, 4, dtype=torch.float64)
    ratios = torch.tensor([[0.9 + 1e-9, 1.1 - 1e-9, 0.9 - 1e-9, 1.1 + 1e-9]], dtype=torch.float64)
    m = rollout_drift(ratios.log(), rollout, torch.ones(1, 4))
    assert m["rollout/importance_ratio_outside"] == 0.5
    assert "rollout/importance_ratio_raw_mean" not in m
    assert rollout_drift(ratios.log(), rollout, torch.zeros(1, 4)) == {}


def _log_of_exactly(ratio: float) -> float:
    """A float64 log-prob gap whose torch.exp is `ratio` to the last bit (log then exp may be an
    ulp off; a few neighbouring gaps hit it exactly)."""
    x = math.log(ratio)
    for _ in range(16):
        got = torch.tensor(x, dtype=torch.float64).exp().item()
        if got == ratio:
            return x
        x = math.nextafter(x, -math.inf if got > ratio else math.inf)
    raise AssertionError(f"no float64 gap has exp {ratio!r}")


def test_the_band_holds_its_edges():
    """[0.9, 1.1] is closed: a ratio of exactly 0.9 or 1.1 is inside (a hair past either is
    outside: test_drift_band_is_0_9_to_1_1_and_raw_is_optional)."""
    edges = torch.tensor([[_log_of_exactly(0.9), _log_of_exactly(1.1)]], dtype=torch.float64)
    rollout = torch.zeros(1, 2, dtype=torch.float64)
    m = rollout_drift(edges, rollout, torch.ones(1, 2), raw_lp=edges)
    assert m["rollout/importance_ratio_mean"] == pytest.approx(1.0)
    assert m["rollout/importance_ratio_outside"] == 0.0
    assert m["rollout/importance_ratio_raw_outside"] == 0.0


def _batch():
    lengths = [12, 5, 15]
    ids, attn = padded_batch(lengths, seed=4)
    masks = []
    for i, n in enumerate(lengths):
        pos = torch.arange(max(1, n - 6), n)
        masks.append(ReplayedMasks(pos, random_bitmask(ids[i, pos], seed=20 + i)))
    sampled = torch.zeros(ids.shape)
    for i, m in enumerate(masks):
        sampled[i, m.positions] = 1.0
    return Batch(ids, attn, sampled, torch.zeros(ids.shape), torch.zeros(ids.shape), masks)


@pytest.mark.parametrize("packed", [False, True])
def test_old_logprobs_are_the_masked_and_the_whole_vocabulary_logprobs(packed):
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    batch, temperature = _batch(), 0.8
    with torch.no_grad(), ac.role("actor"):
        logits = ac.actor_logits(batch.input_ids, batch.attention).float() / temperature
        passes = Passes(ac, temperature, packed)
        with passes.active():
            masked, raw = passes.old_logprobs(batch)
    for i, m in enumerate(batch.masks):
        pos = m.positions
        targets = batch.input_ids[i, pos]
        full = torch.log_softmax(logits[i, pos - 1], -1).gather(-1, targets[:, None])[:, 0]
        assert torch.allclose(raw[i, pos], full, atol=1e-5)
        off = torch.ones(batch.input_ids.shape[1], dtype=torch.bool)
        off[pos] = False
        assert torch.all(raw[i, off] == 0) and torch.all(masked[i, off] == 0)
    on = batch.sampled.bool()
    assert torch.all(raw[on] <= masked[on] + 1e-6)  # the mask only removes mass
    assert (masked[on] - raw[on]).min() > 0.1  # each mask removes about 70% of the vocabulary
    assert masked[0, batch.masks[0].positions[0]].abs() < 1e-6  # the forced token: log-prob 0


def test_prepare_reports_the_ratios_of_the_rollout_logprobs():
    """Rollout log-probs equal to the masked old log-probs give ratio 1 everywhere; the raw ratio
    is each sampled token's share of the mass its mask keeps."""
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8))
    batch = _batch()
    ppo = PPOConfig(kl_mode="none")
    old, raw, _, _, _ = forward_passes(ac, batch, ppo, 1.0)
    batch.rollout_logprobs = old.clone()
    m = prepare(ac, batch, ppo, 1.0).metrics
    on = batch.sampled.bool()
    assert m["rollout/importance_ratio_mean"] == pytest.approx(1.0)
    assert m["rollout/importance_ratio_outside"] == 0.0
    assert m["rollout/logprob_gap_max"] == 0.0
    assert m["rollout/importance_ratio_raw_mean"] == pytest.approx(
        (raw[on] - old[on]).exp().mean().item(), rel=1e-6
    )
    assert m["rollout/importance_ratio_raw_mean"] < 0.8
    assert m["rollout/importance_ratio_raw_outside"] > 0.5
