"""What a training step writes besides its records: the step metrics that come from the episodes,
and the advantages at the action tokens by turn and tool. Pure functions of the episodes (and,
for advantages, of the records' credits), shared by the local trainer, the dose step and the
converter of verl's outputs.

step_summary(...)     protocol counts, per-source scores and lengths, under metric names
call_advantages(...)  the advantage at each record's action token, by turn and tool
"""

from __future__ import annotations

import math
from collections import defaultdict

from atlas.contracts.protocol import PINNED_COUNTS
from atlas.runtime.episode import Episode
from atlas.runtime.protocol import ProtocolReport
from atlas.runtime.records import Credit, ExecutionRecord
from atlas.runtime.rollouts import SOURCES


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


def rollout_throughput(episodes: list[Episode], seconds: float | None) -> dict[str, float]:
    """perf/rollout_tokens: the tokens the policy generated in the step's rollouts (every
    generation's, the grammar's forced tokens included); perf/rollout_tokens_per_s: those tokens
    over the rollout's wall seconds (timing_s/gen: the model, the tools and the graders), as
    verl's perf/throughput counts tokens over time."""
    tokens = sum(r.generated_tokens for ep in episodes for r in ep.records)
    out = {"perf/rollout_tokens": float(tokens)}
    if seconds:
        out["perf/rollout_tokens_per_s"] = tokens / seconds
    return out


def _moments(xs: list[float]) -> dict[str, float]:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs)}


def call_advantages(
    episodes: list[Episode],
    credits: list[list[Credit]],
    *,
    run: str,
    step: int,
    gamma: float,
    dose: float = 1.0,
) -> list[dict]:
    """One row per (turn, tool): the advantage at the action tokens of those calls, with the
    mean reward and the mean potential delta gamma * Phi(s') - Phi(s) (before the dose).
    `credits`: each episode's, in record order."""
    groups: dict[tuple[int, str], list[tuple[ExecutionRecord, Credit]]] = defaultdict(list)
    for ep, mine in zip(episodes, credits, strict=True):
        for rec, credit in zip(ep.records, mine, strict=True):
            groups[(rec.turn, rec.tool)].append((rec, credit))
    rows = []
    for (turn, tool), pairs in sorted(groups.items()):
        n = len(pairs)
        cs = [c for _, c in pairs]
        # verl's trainer keeps values and advantages to itself (atlas.verl.convert): null there.
        known = all(c.advantage is not None and c.value is not None for c in cs)
        adv = _moments([c.advantage for c in cs]) if known else dict.fromkeys(("mean", "std", "min", "max"))
        rows.append(
            {
                "run": run,
                "step": step,
                "dose": dose,
                "turn": turn,
                "tool": tool,
                "count": n,
                **{f"advantage_{k}": v for k, v in adv.items()},
                "value_mean": sum(c.value for c in cs) / n if known else None,
                "reward_mean": sum(c.reward for c in cs) / n,
                "score_mean": sum(r.score for r, _ in pairs) / n,
                "potential_delta_mean": sum(gamma * c.potential_after - c.potential_before for c in cs) / n,
            }
        )
    return rows
