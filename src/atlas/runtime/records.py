"""ExecutionRecord: one typed record per generation, written once by the runtime and never
changed; and Credit, what training assigns to a record. A row of records.parquet (the fixed
pyarrow schema of atlas.contracts.records) is a record's columns with its credit's.

A record is written for every generation, before any update uses it. Reward is scored only from
the record (its tool, arguments and tool result) and is placed on the record's `action_token`:
the position, in the episode's trajectory, of the generation's last sampled token (every token
after it is forced by the grammar, so it is the token that completed the call).

Who writes what:
    ExecutionRecord   the runtime (atlas.runtime.episode.record_turn), frozen once written
    Credit            reward shaping (reward, potentials: atlas.rl.rewards), then GAE (value,
                      advantage: atlas.rl.rollout.credits_of), each a new frozen value; a record
                      without one (validation, smoke, boundary) is written with reward = score
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from atlas.contracts.records import RECORD_SCHEMA
from atlas.hashing import atomic_path


@dataclass(frozen=True)
class ExecutionRecord:
    run: str
    step: int
    phase: str  # "train" | "val"
    question_uid: str
    source: str  # "gpqa" | "lcb"
    sample: int  # index of the episode among the question's samples
    turn: int  # 0-based generation index within the episode
    tool: str  # the called tool's name ("" when no call could be parsed)
    arguments: str  # canonical JSON of the call's arguments ("" when unparsed)
    action_token: int  # trajectory position of the generation's last sampled token (-1: none)
    generation_start: int  # trajectory position of the generation's first token
    generated_tokens: int  # tokens in the generation, stop token included
    forced_tokens: int  # of those, forced by the grammar (sampled = 0)
    finish_reason: str  # "stop" | "length"
    tool_status: str  # "ok" | "error" | "timeout" | "refused"
    tool_output_sha256: str
    tool_output_excerpt: str  # capped to runtime.tool_output_chars
    sandboxed: bool  # the tool's program (if any) ran inside the bubblewrap sandbox
    score: float  # from the record alone: graded submissions; 0 for other calls
    timing_s_generate: float = 0.0  # measured; excluded from comparisons and hashes of results
    timing_s_tool: float = 0.0


@dataclass(frozen=True)
class Credit:
    """What training assigns to one record, kept beside it: credit k of an episode is record k's."""

    reward: float  # placed on the record's action_token: score + shaping
    potential_before: float | None = None  # Phi(s_k)
    potential_after: float | None = None  # Phi(s_{k+1}), 0 after the last record
    value: float | None = None  # critic value at action_token, after the forward passes
    advantage: float | None = None  # advantage at action_token, after GAE

    @classmethod
    def unshaped(cls, record: ExecutionRecord) -> Credit:
        """A record that no training step shaped: its reward is its score."""
        return cls(reward=record.score)


# records.parquet's columns as field names (timing_s/generate -> timing_s_generate), in order.
COLUMNS = [f.name.replace("timing_s/", "timing_s_") for f in RECORD_SCHEMA]
_RECORD_FIELDS = [f.name for f in fields(ExecutionRecord)]
_CREDIT_FIELDS = [f.name for f in fields(Credit)]
assert sorted(COLUMNS) == sorted(_RECORD_FIELDS + _CREDIT_FIELDS), "records.parquet columns"


def record_row(record: ExecutionRecord, credit: Credit | None = None) -> dict[str, Any]:
    """One row of records.parquet by field name, in column order: the record and its credit
    (none: reward = score)."""
    values = {**asdict(record), **asdict(credit or Credit.unshaped(record))}
    return {name: values[name] for name in COLUMNS}


def split_row(row: dict[str, Any]) -> tuple[ExecutionRecord, Credit]:
    """A row by field name (as record_row gives it) back into its record and credit."""
    return (
        ExecutionRecord(**{k: row[k] for k in _RECORD_FIELDS}),
        Credit(**{k: row[k] for k in _CREDIT_FIELDS}),
    )


def write_records(
    path: str | Path, records: Sequence[ExecutionRecord], credits: Sequence[Credit] | None = None
) -> None:
    """records.parquet: each record with its credit (`credits` in the records' order; none: every
    reward is its record's score)."""
    if credits is not None and len(credits) != len(records):
        raise ValueError(f"{len(credits)} credits for {len(records)} records")
    rows = []
    for k, r in enumerate(records):
        row = record_row(r, None if credits is None else credits[k])
        row["timing_s/generate"] = row.pop("timing_s_generate")
        row["timing_s/tool"] = row.pop("timing_s_tool")
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
