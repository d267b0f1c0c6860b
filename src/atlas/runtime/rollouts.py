"""Rollouts of a policy over episode specs, their protocol check, and the validation rows.

episode_specs(...)   the episodes of a question list, `samples` each
rollout(...)         the episodes, sampled with the actor adapter active
check_protocol(...)  the protocol invariants (with the reward vectors an update will use)
validation_rows(...) utility, accuracy and completion by source, for the arms' curves

Training (atlas.rl.rollout) and full validation share these; nothing here imports the update.
"""

from __future__ import annotations

from collections.abc import Callable

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.runtime.episode import Episode, EpisodeSpec, run_episodes
from atlas.runtime.protocol import ProtocolReport, check_episodes
from atlas.runtime.session import Runtime

SOURCES = ("gpqa", "lcb")


def episode_specs(questions: list[dict], tests: dict, samples: int) -> list[EpisodeSpec]:
    return [EpisodeSpec(q, tests.get(q["question_uid"], []), k) for q in questions for k in range(samples)]


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
