"""The ordered question inputs prepare_data writes, as fixed pyarrow schemas.

results/data/train.parquet   TRAIN_SCHEMA: one row per schedule slot, in training order
results/data/val.parquet     VAL_SCHEMA: one row per validation question, GPQA then LCB
results/data/tests.parquet   TESTS_SCHEMA: one row per LiveCodeBench test, train and val
"""

from __future__ import annotations

import pyarrow as pa

QUESTION_FIELDS = [
    pa.field("question_uid", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("record_id", pa.string(), nullable=False),
    pa.field("origin", pa.string(), nullable=False),
    pa.field("question", pa.string(), nullable=False),
    pa.field("text_sha256", pa.string(), nullable=False),
    pa.field("title", pa.string()),
    pa.field("options", pa.list_(pa.string())),
    pa.field("permutation", pa.list_(pa.int8())),
    pa.field("correct_letter", pa.string()),
    pa.field("subdomain", pa.string()),
    pa.field("domain", pa.string()),
    pa.field("platform", pa.string()),
    pa.field("contest_id", pa.string()),
    pa.field("contest_date", pa.string()),
    pa.field("difficulty", pa.string()),
    pa.field("starter_code", pa.string()),
    pa.field("func_name", pa.string()),
    pa.field("test_type", pa.string()),
    pa.field("n_public_tests", pa.int32(), nullable=False),
    pa.field("n_private_tests", pa.int32(), nullable=False),
]

# results/data/train.parquet: one row per schedule slot, in training order.
TRAIN_SCHEMA = pa.schema(
    [
        pa.field("slot", pa.int32(), nullable=False),  # global order, 0 .. steps*per_step-1
        pa.field("step", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),  # order within the step
        *QUESTION_FIELDS,
    ]
)

# results/data/val.parquet: one row per validation question, GPQA rows then LCB rows.
VAL_SCHEMA = pa.schema([pa.field("position", pa.int32(), nullable=False), *QUESTION_FIELDS])

# results/data/tests.parquet: one row per LiveCodeBench test, train and val.
TESTS_SCHEMA = pa.schema(
    [
        pa.field("question_uid", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("visibility", pa.string(), nullable=False),  # "public" | "private"
        pa.field("index", pa.int32(), nullable=False),
        pa.field("testtype", pa.string(), nullable=False),
        pa.field("input", pa.large_string(), nullable=False),
        pa.field("output", pa.large_string(), nullable=False),
    ]
)
