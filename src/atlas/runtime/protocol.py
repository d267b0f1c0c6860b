"""Protocol checks, per batch of episodes: the report's invariants, counted, never a crash.

- each generation holds exactly one parsed call (one `<tool_call>` and one `</tool_call>` token,
  valid JSON between them, a name and an arguments object) and ends with a stop token;
- records == generations;
- every action token is a sampled, loss-mask-1 token inside its own generation;
- only the stop token follows the call, and the record names the call the tokens hold;
- the tool was offered on that turn, its arguments fit the schema, the generation fits the bound,
  the trajectory fits runtime.max_trajectory_tokens;
- every non-zero reward sits on a recorded action token.

Each broken invariant becomes a violation row (kind, episode, turn, detail) in protocol.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from atlas.hashing import canonical_json
from atlas.runtime.tools import check_arguments


def parse_call(
    gen_ids: list[int], decode, open_id: int, close_id: int
) -> tuple[dict[str, Any] | None, str | None]:
    """The one call in a generation, or (None, why not). Parsing is by token id, never by text."""
    opens = [i for i, t in enumerate(gen_ids) if t == open_id]
    closes = [i for i, t in enumerate(gen_ids) if t == close_id]
    if len(opens) != 1 or len(closes) != 1:
        return None, f"{len(opens)} call-open and {len(closes)} call-close tokens, expected one each"
    if closes[0] < opens[0]:
        return None, "call-close token before call-open token"
    text = decode(gen_ids[opens[0] + 1 : closes[0]])
    try:
        call = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"call is not JSON ({err})"
    if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["name"], str):
        return None, 'call must be {"name": str, "arguments": {...}}'
    return call, None


@dataclass
class ProtocolReport:
    episodes: int = 0
    completed: int = 0
    generations: int = 0
    records: int = 0
    calls: int = 0
    violations: int = 0
    violation_rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, episode, turn: int | None, detail: str) -> None:
        self.violations += 1
        self.violation_rows.append(
            {
                "kind": kind,
                "question_uid": episode.question["question_uid"],
                "sample": episode.sample,
                "turn": turn,
                "detail": detail,
            }
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["violation_rows"] = self.violation_rows
        return out


def token_rewards(episode, credits=None) -> list[float]:
    """The per-token reward vector of an episode: each record's reward on its action token. The
    reward is the record's credit's (`credits`, in record order: atlas.runtime.records.Credit),
    or without credits its score (a record no training step shaped)."""
    rewards = [0.0] * len(episode.token_ids)
    if credits is None:
        values = [r.score for r in episode.records]
    else:
        values = [c.reward for c in credits]
    for r, reward in zip(episode.records, values, strict=True):
        if reward != 0.0:
            rewards[r.action_token] += reward
    return rewards


def check_episodes(
    episodes,
    decode,
    open_id: int,
    close_id: int,
    report: ProtocolReport | None = None,
    *,
    max_trajectory_tokens: int | None = None,
    rewards_of=None,
) -> ProtocolReport:
    """Count the invariants over `episodes` into `report` (a new one by default). `rewards_of(ep)`
    gives the per-token reward vector an update will use; without it, the records' scores."""
    report = report or ProtocolReport()
    for ep in episodes:
        report.episodes += 1
        report.completed += ep.end_reason == "submit"
        report.generations += len(ep.generations)
        report.records += len(ep.records)
        if len(ep.records) != len(ep.generations):
            report.add(
                "records_ne_generations",
                ep,
                None,
                f"{len(ep.records)} records, {len(ep.generations)} generations",
            )
        for turn, (gen, rec) in enumerate(zip(ep.generations, ep.records, strict=False)):
            ids = ep.token_ids[gen.start : gen.end]
            call, error = parse_call(ids, decode, open_id, close_id)
            if call is None:
                report.add("no_single_call", ep, turn, error)
            else:
                report.calls += 1
                if ids[ids.index(close_id) + 1 :] != ids[-1:] or len(ids) < 2:
                    report.add("tokens_after_call", ep, turn, "more than the stop token follows </tool_call>")
                if (rec.tool, rec.arguments) != (call["name"], canonical_json(call["arguments"])):
                    report.add(
                        "record_differs_from_call", ep, turn, f"record says {rec.tool} {rec.arguments[:80]}"
                    )
                tool = gen.offered.get(call["name"])
                if tool is None:
                    report.add("tool_not_offered", ep, turn, f"{call['name']!r} not in {sorted(gen.offered)}")
                elif problem := check_arguments(tool, call["arguments"]):
                    report.add("arguments_out_of_bounds", ep, turn, problem)
            if rec.finish_reason != "stop" or not ids or ids[-1] not in gen.stop_ids:
                report.add("no_stop_token", ep, turn, f"finish_reason {rec.finish_reason}")
            if gen.end - gen.start > gen.token_bound:
                report.add("over_token_bound", ep, turn, f"{gen.end - gen.start} > {gen.token_bound}")
            a = rec.action_token
            if not (gen.start <= a < gen.end) or ep.sampled[a] != 1 or ep.loss_mask[a] != 1:
                report.add(
                    "action_token_not_sampled", ep, turn, f"action_token {a} in [{gen.start}, {gen.end})"
                )
        if max_trajectory_tokens is not None and len(ep.token_ids) > max_trajectory_tokens:
            report.add("over_trajectory_limit", ep, None, f"{len(ep.token_ids)} > {max_trajectory_tokens}")
        # The reward vector the update uses (given by training), or the records' scores.
        rewards = rewards_of(ep) if rewards_of is not None else token_rewards(ep)
        action_tokens = {r.action_token for r in ep.records}
        stray = [i for i, x in enumerate(rewards) if x != 0.0 and i not in action_tokens]
        if stray:
            report.add("reward_off_action_token", ep, None, f"rewards at {stray[:5]}")
    return report
