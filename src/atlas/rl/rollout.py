"""One training step's rollout data, engine-free past the rollout: episodes -> timings, shaped
rewards, credits. (The rollouts themselves and the validation rows are atlas.runtime.rollouts,
which full validation runs without the PPO update; the step that uses these is atlas.rl.step.)

rollout_timings(...)  the rollout's wall time, the engine's share of it and the rest
shape(...)            rewards from records (+ potential shaping, telescoping asserted per
                      episode), placed on action tokens
credits_of(...)       each record's Credit: its reward and potentials, and its value and
                      advantage at its action token after GAE
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from atlas.rl.potentials import Potential, evaluate_potentials
from atlas.rl.ppo import Prepared
from atlas.rl.rewards import PlacedRewards, shape_episode
from atlas.runtime.episode import Episode
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.records import Credit


def step_questions(train_rows: list[dict], step: int) -> list[dict]:
    """The schedule's questions for `step`, in their order within the step."""
    rows = sorted((r for r in train_rows if r["step"] == step), key=lambda r: r["position"])
    if not rows:
        raise ValueError(f"train.parquet holds no questions for step {step}")
    return rows


@dataclass
class StepRollout:
    """A step's episodes as they are journaled: the records the runtime wrote, each record's
    credit (per episode, in record order) and the protocol report, over the global batch."""

    episodes: list[Episode]
    credits: list[list[Credit]]
    report: ProtocolReport


def rollout_timings(episodes: list[Episode], seconds: float) -> dict[str, float]:
    """A record's generate time is its share of the engine's wall time (each step's time shared
    among its rows), so the sum is the engine's; the rest of the rollout is the tools and graders
    the engine waited for, and the episodes' bookkeeping."""
    model = sum(r.timing_s_generate for ep in episodes for r in ep.records)
    return {"timing_s/gen": seconds, "timing_s/gen_model": model, "timing_s/gen_tools": seconds - model}


def shape(
    episodes: list[Episode],
    potential: Potential,
    *,
    gamma: float,
    dose: float,
    phis: list[list[float]] | None = None,
) -> list[PlacedRewards]:
    """Rewards on action tokens (score + dose-scaled shaping), per episode; the records are not
    changed. `phis`: the potential's values per episode, when already computed (they do not
    depend on the dose); by default computed here, for all episodes at once."""
    if phis is None:
        phis = evaluate_potentials(potential, episodes)
    return [
        shape_episode(ep, potential, gamma=gamma, dose=dose, phi=phi)
        for ep, phi in zip(episodes, phis, strict=True)
    ]


def credits_of(
    episodes: list[Episode], placed: list[PlacedRewards], prep: Prepared | None = None
) -> list[list[Credit]]:
    """Each record's credit: reward and potentials from the shaping, and with `prep` (after GAE)
    the critic value and (whitened) advantage at its action token."""
    out = []
    for i, (ep, p) in enumerate(zip(episodes, placed, strict=True)):
        credits = p.credits()
        if prep is not None:
            credits = [
                replace(
                    c,
                    value=float(prep.values[i, rec.action_token]),
                    advantage=float(prep.advantages[i, rec.action_token]),
                )
                for rec, c in zip(ep.records, credits, strict=True)
            ]
        out.append(credits)
    return out
