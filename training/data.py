"""Training data: the shards' token columns, memory-mapped, and the seeded stream of batches.

Every worker opens the token columns of the train and dev shards and the planner makes one
global, seeded plan of token-budget batches per epoch. The plans are read as one endless stream
whose ``(epoch, index)`` cursor a checkpoint stores, so a resume takes the exact next batch.

The token ids are read from the shard stage's uncompressed Arrow IPC files
(``<shard>/arrow/<split>/part-*.arrow``, the twins of ``<shard>/<split>/part-*.parquet``)
through memory maps: the values stay in the page cache, shared by every worker of a node (and
evictable, so a corpus larger than memory still trains); a worker's own memory holds the row
lengths and the batch plan, not the tokens. Shard folders written before those files existed,
or on a remote filesystem, are read from Parquet into each worker's memory, with a warning.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from filesystem.location import open_location
from transformer_core.batching import collate, plan_batches, plan_batches_fairseq

log = logging.getLogger(__name__)

IPC_FOLDER = "arrow"
"""``<shard>/arrow/<split>/part-N.arrow`` is the Arrow IPC twin of
``<shard>/<split>/part-N.parquet`` (written by the shard stage, ``corpora.encoding``)."""

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One run of rows: source values, source offsets, target values, target offsets (CSR)."""


def shard_files(folder: str) -> list[str]:
    """The Parquet parts of one shard split (``part-*.parquet``), sorted; [] if none."""
    names = open_location(folder).files()
    return [p for p in names if Path(p).name.startswith("part-") and p.endswith(".parquet")]


def ipc_folder(folder: str) -> Path:
    """Where the Arrow IPC twins of a split folder's Parquet parts are:
    ``<shard>/arrow/<split>``."""
    return Path(folder).parent / IPC_FOLDER / Path(folder).name


def token_files(folder: str) -> list[str] | None:
    """The Arrow IPC twins of a local split's Parquet parts, in order; None unless every part
    has one (an older shard folder) or when ``folder`` is not on this node's disk (a memory map
    needs a local file)."""
    if open_location(folder).local() is None:
        return None
    twins = [
        str(ipc_folder(folder) / Path(f).with_suffix(".arrow").name) for f in shard_files(folder)
    ]
    return twins if twins and all(Path(t).is_file() for t in twins) else None


class TokenData:
    """One shard split: per side, flat token values and row offsets (CSR layout), in one or more
    chunks of consecutive rows (one per Arrow record batch when memory-mapped)."""

    def __init__(
        self,
        src_values: np.ndarray,
        src_offsets: np.ndarray,
        tgt_values: np.ndarray,
        tgt_offsets: np.ndarray,
    ):
        self.chunks: list[Chunk] = [(src_values, src_offsets, tgt_values, tgt_offsets)]
        self.starts = np.array([0, src_offsets.size - 1], dtype=np.int64)

    @classmethod
    def from_chunks(cls, chunks: Sequence[Chunk]) -> TokenData:
        """Consecutive chunks of rows as one split (each chunk's offsets index its own values)."""
        if not chunks:
            raise ValueError("no chunks of rows")
        data = cls(*chunks[0])
        data.chunks = list(chunks)
        data.starts = np.r_[0, np.cumsum([c[1].size - 1 for c in chunks])].astype(np.int64)
        return data

    @classmethod
    def read(cls, folder: str, vocab_size: int) -> TokenData:
        """The split in ``folder``: its ``part-*.arrow`` files memory-mapped, or, without them,
        every ``part-*.parquet`` read into memory (with a warning), in name order."""
        files = shard_files(folder)
        if not files:
            raise FileNotFoundError(f"no part-*.parquet files in {folder}")
        mapped = token_files(folder)
        if mapped is not None:
            data = cls.map(mapped)
        else:
            log.warning(
                "%s lacks the Arrow token files %s/part-*.arrow: every worker reads the Parquet "
                "shards into its own memory; rerun `tfm stage shard --config <config> --force` "
                "to write them and share one copy per node",
                folder,
                ipc_folder(folder),
            )
            data = cls.read_parquet(folder)
        data.check_vocab(vocab_size, folder)
        return data

    @classmethod
    def map(cls, files: Sequence[str]) -> TokenData:
        """Memory-map Arrow IPC shard files: every array is a read-only view of the page cache."""
        import pyarrow as pa
        import pyarrow.ipc

        chunks: list[Chunk] = []
        for path in files:
            reader = pyarrow.ipc.open_file(pa.memory_map(path, "r"))
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                if batch.num_rows == 0:
                    continue
                sides: list[np.ndarray] = []
                for name in ("src_ids", "tgt_ids"):
                    column = batch.column(name)
                    sides += [
                        column.values.to_numpy(zero_copy_only=True),
                        column.offsets.to_numpy(zero_copy_only=True),
                    ]
                chunks.append((sides[0], sides[1], sides[2], sides[3]))
        if not chunks:
            raise ValueError(f"the token files {files[0]}... hold no rows")
        return cls.from_chunks(chunks)

    @classmethod
    def read_parquet(cls, folder: str) -> TokenData:
        """Every ``part-*.parquet`` of ``folder`` read into this process's memory (one chunk;
        uint16 ids when they fit)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = shard_files(folder)
        if not files:
            raise FileNotFoundError(f"no part-*.parquet files in {folder}")
        fs = open_location(folder).arrow
        table = pa.concat_tables(
            pq.read_table(f, columns=["src_ids", "tgt_ids"], filesystem=fs) for f in files
        )
        sides = []
        for name in ("src_ids", "tgt_ids"):
            arr = table.column(name).combine_chunks()
            offsets = np.asarray(arr.offsets, dtype=np.int64)
            values = np.asarray(arr.values)[offsets[0] : offsets[-1]]
            # uint16 halves the memory of every worker's copy when the ids allow it.
            small = values.size == 0 or int(values.max()) < 1 << 16
            sides += [values.astype(np.uint16 if small else np.int32), offsets - offsets[0]]
        return cls(*sides)

    def check_vocab(self, vocab_size: int, folder: str) -> None:
        """A ValueError naming the folder if an id is ``vocab_size`` or more."""
        for c, name in ((0, "src_ids"), (2, "tgt_ids")):
            top = max((int(chunk[c].max()) for chunk in self.chunks if chunk[c].size), default=0)
            if top >= vocab_size:
                raise ValueError(f"{folder}: {name} holds id {top} >= vocab_size {vocab_size}")

    def __len__(self) -> int:
        return int(self.starts[-1])

    @cached_property
    def src_lens(self) -> np.ndarray:
        """Source length of every row (int32: the one array per row a worker keeps)."""
        return np.concatenate([np.diff(c[1]).astype(np.int32) for c in self.chunks])

    @cached_property
    def tgt_lens(self) -> np.ndarray:
        """Target length of every row (int32)."""
        return np.concatenate([np.diff(c[3]).astype(np.int32) for c in self.chunks])

    def ids(self, rows: Sequence[int] | np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The source and the target ids of each of ``rows`` (views, not copies)."""
        rows = np.asarray(rows, dtype=np.int64)
        chunk_of = np.searchsorted(self.starts, rows, side="right") - 1
        local = rows - self.starts[chunk_of]
        src, tgt = [], []
        for c, i in zip(chunk_of.tolist(), local.tolist(), strict=True):
            sv, so, tv, to = self.chunks[c]
            src.append(sv[so[i] : so[i + 1]])
            tgt.append(tv[to[i] : to[i + 1]])
        return src, tgt

    def batch(
        self, rows: np.ndarray, pad_id: int, bos_id: int, pad_multiple: int = 1
    ) -> tuple[torch.Tensor, ...]:
        """``src (B, S)``, ``tgt_in (B, T)``, ``tgt_out (B, T)`` for the given row indices."""
        src, tgt = self.ids(rows)
        return collate(src, tgt, pad_id, bos_id, pad_multiple)


class BatchStream:
    """The epochs' seeded batch plans read as one endless stream; ``(epoch, index)`` is the
    cursor."""

    def __init__(
        self,
        data: TokenData,
        max_tokens: int,
        seed: int,
        epoch: int = 0,
        index: int = 0,
        pad_multiple: int = 1,
        fairseq: bool = False,
    ):
        self.src_lens, self.tgt_lens = data.src_lens, data.tgt_lens
        self.max_tokens, self.seed, self.pad_multiple = max_tokens, seed, pad_multiple
        self.fairseq = fairseq  # train.batching: fairseq
        self.epoch, self.index = epoch, index
        self._plan: list[np.ndarray] | None = None

    def _current(self) -> list[np.ndarray]:
        if self._plan is None:
            plan = plan_batches_fairseq if self.fairseq else plan_batches
            self._plan = plan(
                self.src_lens,
                self.tgt_lens,
                self.max_tokens,
                seed=self.seed,
                epoch=self.epoch,
                pad_multiple=self.pad_multiple,
            )
        return self._plan

    def take(self, n: int) -> list[np.ndarray]:
        """The next ``n`` batches (row indices), crossing into the next epoch when one ends."""
        out = []
        while len(out) < n:
            plan = self._current()
            if self.index >= len(plan):
                self.epoch, self.index, self._plan = self.epoch + 1, 0, None
                continue
            out.append(plan[self.index])
            self.index += 1
        return out

    @property
    def position(self) -> dict[str, int]:
        """The cursor: the epoch and the index in its plan of the next batch."""
        return {"epoch": self.epoch, "index": self.index}

    def at(self, epoch: int, index: int) -> BatchStream:
        """The same stream with a cursor of its own at ``(epoch, index)`` (its plan made afresh)."""
        stream = copy.copy(self)
        stream.epoch, stream.index, stream._plan = epoch, index, None
        return stream
