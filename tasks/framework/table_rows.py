"""Row counts of Parquet and Arrow IPC files, from their footers: what a manifest records and
``damage`` checks."""

from __future__ import annotations

from pathlib import Path


def parquet_rows(path: Path) -> int | None:
    """The row count in a Parquet file's footer; None if the footer does not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError):
        return None


TABLE_FILES = {".parquet": "Parquet", ".arrow": "Arrow IPC"}
"""Files whose row count the manifest records and ``damage`` checks, by suffix."""


def table_rows(path: Path) -> int | None:
    """The row count of a Parquet or Arrow IPC file, from its footer (and an IPC file's batch
    headers); None if it does not read."""
    if path.suffix != ".arrow":
        return parquet_rows(path)
    import pyarrow as pa
    import pyarrow.ipc

    try:
        with pa.memory_map(str(path)) as source:
            reader = pyarrow.ipc.open_file(source)
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (pa.ArrowException, OSError):
        return None
