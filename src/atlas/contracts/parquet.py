"""Reading one parquet file of the contracts' (a stage's input, a run's table, a journal part), and
building one to a contract's schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def read_table(path: str | Path) -> pa.Table:
    """The whole table of the parquet file `path`. One file through pq.ParquetFile: pq.read_table
    imports pyarrow.dataset for any path (0.26 s of CPU a process). A file that is not parquet
    (truncated, corrupt) raises ArrowInvalid naming it."""
    try:
        with pq.ParquetFile(path) as f:
            return f.read()
    except pa.ArrowInvalid as e:
        raise pa.ArrowInvalid(f"{path}: {e}") from e


def arrow_table(rows: list[dict], schema: pa.Schema, what: str) -> pa.Table:
    """`rows` as a table of exactly `schema` (absent keys are null); a key the schema does not
    declare is an error naming it, never a column dropped or added on the quiet."""
    names = set(schema.names)
    extra = sorted({k for row in rows for k in row} - names)
    if extra:
        raise ValueError(f"{what}: columns {extra} are not in its schema (atlas.contracts)")
    return pa.Table.from_pylist(rows, schema=schema)
