"""Reading one parquet file of the contracts' (a stage's input, a run's table, a journal part)."""

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
