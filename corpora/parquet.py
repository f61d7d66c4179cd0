"""Parquet files written in order: the clean stage's text pairs and the shard stage's token ids.

Hand-written rather than Ray Data's ``write_parquet``: Ray names and sizes files by task, and the
pipeline promises byte-identical reruns with a fixed number of rows per file. The shard stage
also writes each part as an uncompressed Arrow IPC file (Feather v2), in a folder of its own so
the Parquet folder stays a plain Parquet dataset: the form training memory-maps, so the workers
of a node share one copy in the page cache.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq

from corpora import CorpusError

__all__ = ["TEXT_SCHEMA", "ParquetShardWriter", "part_files"]

TEXT_SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])
"""Pairs of text (the clean stage's ``train/``, the linearize stage's trees)."""


def part_files(folder: Path) -> list[Path]:
    """The ``part-*.parquet`` files of a folder in order; an error naming the folder if none."""
    files = sorted(Path(folder).glob("part-*.parquet"))
    if not files:
        raise CorpusError(f"no part-*.parquet files in {folder}")
    return files


class ParquetShardWriter:
    """Writes an ordered stream of Arrow tables as ``part-00000.parquet``... of
    ``rows_per_file`` rows.

    Same input tables, same files byte for byte: each incoming table (cut at file boundaries)
    becomes one row group, and the writer options are fixed. With ``ipc_folder``, every part
    also gets its uncompressed Arrow IPC twin there (``part-00000.arrow``: the same rows, one
    record batch per row group).
    """

    def __init__(
        self,
        folder: Path,
        schema: pa.Schema,
        rows_per_file: int,
        compression: str = "zstd",
        *,
        ipc_folder: Path | None = None,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.rows_per_file = rows_per_file
        self.compression = compression
        self.ipc_folder = None if ipc_folder is None else Path(ipc_folder)
        if self.ipc_folder is not None:
            self.ipc_folder.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._ipc_writer: pyarrow.ipc.RecordBatchFileWriter | None = None
        self._in_file = 0

    def write(self, table: pa.Table) -> None:
        """Append rows (in order)."""
        table = table.select(self.schema.names).cast(self.schema)
        offset = 0
        while offset < table.num_rows:
            writer = self._writer
            if writer is None or self._in_file == self.rows_per_file:
                writer = self._open()
            take = min(self.rows_per_file - self._in_file, table.num_rows - offset)
            chunk = table.slice(offset, take)
            writer.write_table(chunk, row_group_size=max(1, take))
            if self._ipc_writer is not None:
                self._ipc_writer.write_table(chunk)
            self._in_file += take
            self.rows += take
            offset += take

    def close(self) -> list[Path]:
        """Finish the last file (an empty stream still gives one file with the schema); the
        paths."""
        if self._writer is None:
            self._open()
        self._close_part()
        return self.files

    def _open(self) -> pq.ParquetWriter:
        """A new part file, with its twin; its writer."""
        self._close_part()
        path = self.folder / f"part-{len(self.files):05d}.parquet"
        self.files.append(path)
        self._writer = writer = pq.ParquetWriter(path, self.schema, compression=self.compression)
        if self.ipc_folder is not None:  # uncompressed: a memory map reads the buffers in place
            twin = self.ipc_folder / path.with_suffix(".arrow").name
            self._ipc_writer = pyarrow.ipc.new_file(twin, self.schema)
        self._in_file = 0
        return writer

    def _close_part(self) -> None:
        for writer in (self._writer, self._ipc_writer):
            if writer is not None:
                writer.close()
        self._writer = self._ipc_writer = None
