"""records.parquet as write_records makes it: the fixed schema, one row per record and its credit
with every value as given (no credit: reward = score), the timing columns under their schema
names, zstd, and an atomic replace."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atlas.contracts.records import RECORD_SCHEMA
from atlas.runtime.records import Credit, ExecutionRecord, record_row, split_row, write_records

FIRST = ExecutionRecord(
    run="dose_0.5", step=3, phase="train", question_uid="gpqa-0007", source="gpqa", sample=1, turn=0,
    tool="python", arguments='{"code":"print(2)"}', action_token=41, generation_start=12,
    generated_tokens=30, forced_tokens=2, finish_reason="stop", tool_status="ok",
    tool_output_sha256="ab" * 32, tool_output_excerpt="2\n", sandboxed=True, score=0.0,
    timing_s_generate=0.031, timing_s_tool=0.204,
)  # fmt: skip
FIRST_CREDIT = Credit(reward=-0.125, potential_before=0.5, potential_after=0.25, value=0.75, advantage=-1.5)
SECOND = replace(
    FIRST, turn=1, tool="submit", arguments='{"answer":"C"}', action_token=77, sandboxed=False, score=1.0,
    timing_s_generate=0.012, timing_s_tool=0.0, tool_output_excerpt="é ✓",
)  # fmt: skip
SECOND_CREDIT = Credit(reward=1.0, potential_before=0.25)


def as_row(r: ExecutionRecord, c: Credit) -> dict:
    return {
        "run": r.run, "step": r.step, "phase": r.phase, "question_uid": r.question_uid,
        "source": r.source, "sample": r.sample, "turn": r.turn, "tool": r.tool,
        "arguments": r.arguments, "action_token": r.action_token,
        "generation_start": r.generation_start, "generated_tokens": r.generated_tokens,
        "forced_tokens": r.forced_tokens, "finish_reason": r.finish_reason,
        "tool_status": r.tool_status, "tool_output_sha256": r.tool_output_sha256,
        "tool_output_excerpt": r.tool_output_excerpt, "sandboxed": r.sandboxed, "score": r.score,
        "reward": c.reward, "potential_before": c.potential_before,
        "potential_after": c.potential_after, "value": c.value, "advantage": c.advantage,
        "timing_s/generate": r.timing_s_generate, "timing_s/tool": r.timing_s_tool,
    }  # fmt: skip


def test_every_record_is_one_row_with_its_values(tmp_path):
    path = tmp_path / "records.parquet"
    write_records(path, [FIRST, SECOND], [FIRST_CREDIT, SECOND_CREDIT])
    table = pq.read_table(path)
    assert table.schema.remove_metadata() == RECORD_SCHEMA
    assert table.to_pylist() == [as_row(FIRST, FIRST_CREDIT), as_row(SECOND, SECOND_CREDIT)]
    assert table.column("timing_s/generate").to_pylist() == [0.031, 0.012]
    assert table.column("timing_s/tool").to_pylist() == [0.204, 0.0]


def test_a_record_without_credit_is_written_with_its_score_as_reward(tmp_path):
    path = tmp_path / "records.parquet"
    write_records(path, [FIRST, SECOND])
    rows = pq.read_table(path).to_pylist()
    assert [r["reward"] for r in rows] == [0.0, 1.0]
    assert {r[k] for r in rows for k in ("potential_before", "potential_after", "value", "advantage")} == {
        None
    }


def test_a_row_splits_back_into_its_record_and_credit():
    row = record_row(FIRST, FIRST_CREDIT)
    assert list(row) == [f.name.replace("timing_s/", "timing_s_") for f in RECORD_SCHEMA]
    assert split_row(row) == (FIRST, FIRST_CREDIT)


def test_the_file_is_zstd_compressed(tmp_path):
    path = tmp_path / "records.parquet"
    write_records(path, [FIRST])
    meta = pq.ParquetFile(path).metadata
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"ZSTD"}


def test_no_records_is_an_empty_table_with_the_schema(tmp_path):
    path = tmp_path / "records.parquet"
    write_records(path, [])
    table = pq.read_table(path)
    assert table.num_rows == 0 and table.schema.remove_metadata() == RECORD_SCHEMA


def test_a_record_that_breaks_the_schema_leaves_the_old_file(tmp_path):
    path = tmp_path / "records.parquet"
    write_records(path, [FIRST])
    before = path.read_bytes()
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        write_records(path, [FIRST, replace(SECOND, step="three")])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.parquet"]  # no temporary file left
    write_records(path, [SECOND], [SECOND_CREDIT])  # a good write replaces it whole
    assert pq.read_table(path).to_pylist() == [as_row(SECOND, SECOND_CREDIT)]


def test_credits_for_another_number_of_records_are_refused(tmp_path):
    with pytest.raises(ValueError) as err:
        write_records(tmp_path / "records.parquet", [FIRST], [FIRST_CREDIT, SECOND_CREDIT])
    assert str(err.value) == "2 credits for 1 records"
    assert list(tmp_path.iterdir()) == []
