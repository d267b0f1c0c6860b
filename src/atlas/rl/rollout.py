"""One training step's data, engine-free past the rollout: episodes -> shaped rewards -> batch.
(The rollouts themselves and the validation rows are atlas.runtime.rollouts, which full
validation runs without the PPO update.)

collect(...)        rollouts of the step's questions with the actor, rewards from records
                    (+ potential shaping, telescoping asserted per episode), the protocol
                    check on the reward vectors the update will use, the PPO batch
fill_records(...)   each record's value and advantage at its action token, after GAE
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.rl.potentials import Potential, evaluate_potentials
from atlas.rl.ppo import Batch, Prepared, make_batch
from atlas.rl.replay import replay_masks
from atlas.rl.rewards import PlacedRewards, shape_episode
from atlas.runtime.episode import Episode, EpisodeSpec
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.rollouts import check_protocol, rollout
from atlas.runtime.session import Runtime


def step_questions(train_rows: list[dict], step: int) -> list[dict]:
    """The schedule's questions for `step`, in their order within the step."""
    rows = sorted((r for r in train_rows if r["step"] == step), key=lambda r: r["position"])
    if not rows:
        raise ValueError(f"train.parquet holds no questions for step {step}")
    return rows


@dataclass
class StepRollout:
    episodes: list[Episode]
    placed: list[PlacedRewards]  # per episode, in order
    batch: Batch
    report: ProtocolReport
    timings: dict[str, float]


def shape(
    episodes: list[Episode],
    potential: Potential,
    *,
    gamma: float,
    dose: float,
    phis: list[list[float]] | None = None,
) -> list[PlacedRewards]:
    """Rewards on action tokens (score + dose-scaled shaping), written into the records too.
    `phis`: the potential's values per episode, when already computed (they do not depend on the
    dose); by default computed here, for all episodes at once."""
    if phis is None:
        phis = evaluate_potentials(potential, episodes)
    placed = []
    for ep, phi in zip(episodes, phis, strict=True):
        p = shape_episode(ep, potential, gamma=gamma, dose=dose, phi=phi)
        p.write_to(ep.records)
        placed.append(p)
    return placed


def collect(
    rt: Runtime,
    specs: list[EpisodeSpec],
    cfg: RuntimeConfig,
    graders: GraderConfig,
    potential: Potential,
    *,
    gamma: float,
    dose: float,
    run: str,
    step: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> StepRollout:
    t = time.perf_counter()
    episodes = rollout(
        rt, specs, cfg, graders, run=run, step=step, phase="train", seed=seed, progress=progress
    )
    total = time.perf_counter() - t
    # A record's generate time is its share of the engine's wall time (each step's time shared
    # among its rows), so the sum is the engine's; the rest of the rollout is the tools and graders
    # the engine waited for, and the episodes' bookkeeping.
    model = sum(r.timing_s_generate for ep in episodes for r in ep.records)
    timings = {"timing_s/gen": total, "timing_s/gen_model": model, "timing_s/gen_tools": total - model}
    t = time.perf_counter()
    placed = shape(episodes, potential, gamma=gamma, dose=dose)
    timings["timing_s/potential"] = time.perf_counter() - t
    report = check_protocol(rt, episodes, cfg, placed)
    masks = [replay_masks(ep, rt) for ep in episodes]
    device = next(rt.model.parameters()).device
    batch = make_batch(episodes, [p.token_rewards for p in placed], masks, rt.tokenizer.pad_token_id, device)
    return StepRollout(episodes, placed, batch, report, timings)


def fill_records(episodes: list[Episode], prep: Prepared) -> None:
    """Each record's critic value and (whitened) advantage at its action token."""
    for i, ep in enumerate(episodes):
        for rec in ep.records:
            rec.value = float(prep.values[i, rec.action_token])
            rec.advantage = float(prep.advantages[i, rec.action_token])
