"""ExecutionRecord: one typed record per generation, written with the fixed pyarrow schema of
atlas.contracts.records (its fields are the schema's columns, in order).

A record is written for every generation, before any update uses it. Reward is scored only from
the record (its tool, arguments and tool result) and is placed on the record's `action_token`:
the position, in the episode's trajectory, of the generation's last sampled token (every token
after it is forced by the grammar, so it is the token that completed the call).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from atlas.contracts.records import RECORD_SCHEMA
from atlas.hashing import atomic_path


@dataclass
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
    reward: float  # placed on action_token: score (+ shaping from the training stage)
    potential_before: float | None = None
    potential_after: float | None = None
    value: float | None = None  # critic value at action_token, filled by training
    advantage: float | None = None  # advantage at action_token, filled after GAE
    timing_s_generate: float = 0.0  # measured; excluded from comparisons and hashes of results
    timing_s_tool: float = 0.0


assert [f.name.replace("timing_s/", "timing_s_") for f in RECORD_SCHEMA] == [
    f.name for f in fields(ExecutionRecord)
]


def write_records(path: str | Path, records: list[ExecutionRecord]) -> None:
    rows = []
    for r in records:
        row = asdict(r)
        row["timing_s/generate"] = row.pop("timing_s_generate")
        row["timing_s/tool"] = row.pop("timing_s_tool")
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
