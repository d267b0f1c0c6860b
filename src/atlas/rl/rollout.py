"""One training step's data, engine-free past the rollout: episodes -> shaped rewards -> batch.

collect(...)        rollouts of the step's questions with the actor, rewards from records
                    (+ potential shaping, telescoping asserted per episode), the protocol
                    check on the reward vectors the update will use, the PPO batch
fill_records(...)   each record's value and advantage at its action token, after GAE
call_advantages(...) the advantage at each record's action token, by turn and tool
step_summary(...)   protocol counts, per-source scores and lengths, under metric names
validation_rows(...) utility, accuracy and completion by source, for the arms' curves
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from atlas.config import GraderConfig, RuntimeConfig
from atlas.rl.potentials import Potential
from atlas.rl.ppo import Batch, Prepared, make_batch
from atlas.rl.replay import replay_masks
from atlas.rl.rewards import PlacedRewards, shape_episode
from atlas.runtime.episode import Episode, EpisodeSpec, run_episodes
from atlas.runtime.protocol import PINNED_COUNTS, ProtocolReport, check_episodes
from atlas.runtime.session import Runtime

SOURCES = ("gpqa", "lcb")


def step_questions(train_rows: list[dict], step: int) -> list[dict]:
    """The schedule's questions for `step`, in their order within the step."""
    rows = sorted((r for r in train_rows if r["step"] == step), key=lambda r: r["position"])
    if not rows:
        raise ValueError(f"train.parquet holds no questions for step {step}")
    return rows


def episode_specs(questions: list[dict], tests: dict, samples: int) -> list[EpisodeSpec]:
    return [EpisodeSpec(q, tests.get(q["question_uid"], []), k) for q in questions for k in range(samples)]


@dataclass
class StepRollout:
    episodes: list[Episode]
    placed: list[PlacedRewards]  # per episode, in order
    batch: Batch
    report: ProtocolReport
    timings: dict[str, float]


def check_protocol(rt: Runtime, episodes: list[Episode], cfg: RuntimeConfig, placed=None) -> ProtocolReport:
    """The protocol invariants, checking the reward vectors the update will use when given."""
    vectors = (
        {id(ep): p.token_rewards.tolist() for ep, p in zip(episodes, placed, strict=True)} if placed else None
    )
    return check_episodes(
        episodes,
        rt.decode,
        rt.call_open_id,
        rt.call_close_id,
        max_trajectory_tokens=cfg.max_trajectory_tokens,
        rewards_of=(lambda ep: vectors[id(ep)]) if vectors else None,
    )


def rollout(
    rt: Runtime,
    specs: list[EpisodeSpec],
    cfg: RuntimeConfig,
    graders: GraderConfig,
    *,
    run: str,
    step: int,
    phase: str,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> list[Episode]:
    active = getattr(rt.model, "active_adapter", "actor")
    if active != "actor":  # a rollout must sample the policy, never the critic's adapter
        raise RuntimeError(f"rollout with adapter {active!r} active; expected 'actor'")
    rt.model.eval()
    return run_episodes(
        rt, specs, cfg, graders, run=run, step=step, phase=phase, seed=seed, progress=progress
    )


def shape(episodes: list[Episode], potential: Potential, *, gamma: float, dose: float) -> list[PlacedRewards]:
    """Rewards on action tokens (score + dose-scaled shaping), written into the records too."""
    placed = []
    for ep in episodes:
        p = shape_episode(ep, potential, gamma=gamma, dose=dose)
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
    # A record's generate time is its batch's wall time shared evenly, so the sum is the model's
    # wall time; the rest of the rollout is tools and graders (run in a pool after each turn).
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


def _moments(xs: list[float]) -> dict[str, float]:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs)}


def call_advantages(
    episodes: list[Episode], *, run: str, step: int, gamma: float, dose: float = 1.0
) -> list[dict]:
    """One row per (turn, tool): the advantage at the action tokens of those calls, with the
    mean reward and the mean potential delta gamma * Phi(s') - Phi(s) (before the dose)."""
    groups: dict[tuple[int, str], list] = defaultdict(list)
    for ep in episodes:
        for rec in ep.records:
            groups[(rec.turn, rec.tool)].append(rec)
    rows = []
    for (turn, tool), recs in sorted(groups.items()):
        # verl's trainer keeps values and advantages to itself (atlas.verl.convert): null there.
        known = all(r.advantage is not None and r.value is not None for r in recs)
        adv = _moments([r.advantage for r in recs]) if known else dict.fromkeys(("mean", "std", "min", "max"))
        rows.append(
            {
                "run": run,
                "step": step,
                "dose": dose,
                "turn": turn,
                "tool": tool,
                "count": len(recs),
                **{f"advantage_{k}": v for k, v in adv.items()},
                "value_mean": sum(r.value for r in recs) / len(recs) if known else None,
                "reward_mean": sum(r.reward for r in recs) / len(recs),
                "score_mean": sum(r.score for r in recs) / len(recs),
                "potential_delta_mean": sum(gamma * r.potential_after - r.potential_before for r in recs)
                / len(recs),
            }
        )
    return rows


def step_summary(episodes: list[Episode], report: ProtocolReport) -> dict[str, float]:
    """Protocol counts, scores (overall and per source), and trajectory lengths of one batch."""
    out: dict[str, float] = {f"protocol/{k}": float(getattr(report, k)) for k in PINNED_COUNTS}
    scores = [ep.score for ep in episodes]
    out.update(
        {
            "critic/score/mean": sum(scores) / len(scores),
            "critic/score/max": max(scores),
            "critic/score/min": min(scores),
        }
    )
    for source in SOURCES:
        mine = [ep for ep in episodes if ep.question["source"] == source]
        if mine:
            out[f"score/{source}/mean"] = sum(ep.score for ep in mine) / len(mine)
            out[f"completed/{source}"] = sum(ep.end_reason == "submit" for ep in mine) / len(mine)
    generated = [sum(ep.loss_mask) for ep in episodes]
    out["response_length/mean"] = sum(generated) / len(generated)
    out["response_length/max"] = float(max(generated))
    out["response_length/min"] = float(min(generated))
    out["prompt_length/mean"] = sum(ep.prompt_tokens for ep in episodes) / len(episodes)
    out["turns/mean"] = sum(len(ep.generations) for ep in episodes) / len(episodes)
    return out


def validation_rows(episodes: list[Episode], *, run: str, step: int) -> list[dict]:
    """Per source (and "all"): n, utility (mean score), accuracy (share scored 1), completed share."""
    rows = []
    for source in (*SOURCES, "all"):
        mine = [ep for ep in episodes if source in ("all", ep.question["source"])]
        if not mine:
            continue
        n = len(mine)
        rows.append(
            {
                "run": run,
                "step": step,
                "source": source,
                "n": n,
                "utility": sum(ep.score for ep in mine) / n,
                "accuracy": sum(ep.score >= 1.0 for ep in mine) / n,
                "completed_fraction": sum(ep.end_reason == "submit" for ep in mine) / n,
            }
        )
    return rows
