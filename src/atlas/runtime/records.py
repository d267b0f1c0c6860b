"""ExecutionRecord: one typed record per generation, with one fixed pyarrow schema.

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
    sandboxed: bool  # the tool's program (if any) ran without network
    score: float  # from the record alone: graded submissions; 0 for other calls
    reward: float  # placed on action_token: score (+ shaping from the training stage)
    potential_before: float | None = None
    potential_after: float | None = None
    value: float | None = None  # critic value at action_token, filled by training
    advantage: float | None = None  # advantage at action_token, filled after GAE
    timing_s_generate: float = 0.0  # measured; excluded from comparisons and hashes of results
    timing_s_tool: float = 0.0


RECORD_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("question_uid", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("arguments", pa.string(), nullable=False),
        pa.field("action_token", pa.int32(), nullable=False),
        pa.field("generation_start", pa.int32(), nullable=False),
        pa.field("generated_tokens", pa.int32(), nullable=False),
        pa.field("forced_tokens", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("tool_status", pa.string(), nullable=False),
        pa.field("tool_output_sha256", pa.string(), nullable=False),
        pa.field("tool_output_excerpt", pa.string(), nullable=False),
        pa.field("sandboxed", pa.bool_(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("potential_before", pa.float64()),
        pa.field("potential_after", pa.float64()),
        pa.field("value", pa.float64()),
        pa.field("advantage", pa.float64()),
        pa.field("timing_s/generate", pa.float64(), nullable=False),
        pa.field("timing_s/tool", pa.float64(), nullable=False),
    ]
)
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


# One row per episode: the whole trajectory and its masks, so records can be checked against ids.
TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("question_uid", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),  # 1: generated by the policy
        pa.field("sampled", pa.list_(pa.int8()), nullable=False),  # 1: sampled; 0: forced or not generated
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),  # rollout log-prob; 0 where not sampled
        pa.field("completed", pa.bool_(), nullable=False),  # ended with an executed submit
        pa.field("end_reason", pa.string(), nullable=False),  # "submit" | "trajectory_limit" | "violation"
        pa.field("score", pa.float64(), nullable=False),
        pa.field("turns", pa.int32(), nullable=False),
    ]
)
