"""verl's reward function (`custom_reward_function.path` / `.name = compute_score`), from records only.

The agent loop already puts each record's reward on its action token (rm_scores) and sets the
episode's `reward_score`, so verl's trainer never needs to call this for training. verl still
calls a reward function where it scores whole responses (validation metrics, a reward loop that
finds no score). It reads nothing but the episode's ExecutionRecords (as records.parquet rows,
each with its credit's reward), which reach it through `extra_info` (the agent loop's
extra_fields): the response text and ground truth are ignored,
because a score that re-read the text could disagree with what the tools recorded.

    compute_score(data_source, solution_str, ground_truth, extra_info) ->
        {"score": sum of record rewards, "acc": the submission's score, "calls": records, ...}
"""

from __future__ import annotations

from typing import Any


class RecordsMissingError(KeyError):
    """verl called the reward function for a response that carries no ExecutionRecords."""


def episode_records(extra_info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The records of one episode from verl's extra_info (directly, or under tool_extra_fields)."""
    info = extra_info or {}
    for holder in (info, info.get("tool_extra_fields") or {}, info.get("extra_fields") or {}):
        if isinstance(holder, dict) and "records" in holder:
            return list(holder["records"])
    raise RecordsMissingError(
        f"no 'records' in extra_info (keys: {sorted(info)}); responses must come from the "
        "atlas_tool_agent agent loop, which attaches one ExecutionRecord per turn"
    )


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info=None, **_: Any) -> dict:
    records = episode_records(extra_info)
    for rec in records:
        if rec["source"] != data_source:
            raise ValueError(
                f"record of question {rec['question_uid']} is {rec['source']!r} but verl says {data_source!r}"
            )
    submits = [r for r in records if r["tool"] == "submit" and r["tool_status"] == "ok"]
    return {
        "score": float(sum(r["reward"] for r in records)),
        "acc": float(submits[-1]["score"]) if submits else 0.0,
        "calls": len(records),
        "submitted": bool(submits),
    }
