"""The table full validation writes: one row per trajectory.

    results/validation/<policy>/answers.parquet  ANSWERS_SCHEMA

Built with atlas.contracts.parquet.arrow_table, so a column outside the schema is an error.
"""

from __future__ import annotations

import pyarrow as pa

ANSWERS_SCHEMA = pa.schema(
    [
        pa.field("question_uid", pa.string()),
        pa.field("source", pa.string()),
        pa.field("sample", pa.int64()),
        pa.field("final_answer", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("completed", pa.bool_()),
        pa.field("turns", pa.int64()),
    ]
)
