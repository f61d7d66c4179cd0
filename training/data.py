"""Training data: the shards' token columns in memory and the seeded stream of batches.

Every worker loads the token columns of the train and dev shards, and the planner makes one
global, seeded plan of token-budget batches per epoch. The plans are read as one endless stream
whose ``(epoch, index)`` cursor a checkpoint stores, so a resume takes the exact next batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_core.batching import collate, plan_batches


def open_fs(path: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path inside it, for a local path or a URI (s3://, gs://)."""
    import pyarrow.fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).resolve())


def shard_files(folder: str) -> list[str]:
    """The Parquet parts of one shard split (``part-*.parquet``), sorted; [] if none."""
    import pyarrow.fs as pafs

    fs, root = open_fs(folder)
    info = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = [i.path for i in info if i.type == pafs.FileType.File]
    return sorted(p for p in names if Path(p).name.startswith("part-") and p.endswith(".parquet"))


@dataclass
class TokenData:
    """One shard split in memory: flat token values and row offsets per side (CSR layout)."""

    src_values: np.ndarray
    src_offsets: np.ndarray
    tgt_values: np.ndarray
    tgt_offsets: np.ndarray

    @classmethod
    def read(cls, folder: str, vocab_size: int) -> TokenData:
        """Read every ``part-*.parquet`` of ``folder`` in name order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = shard_files(folder)
        if not files:
            raise FileNotFoundError(f"no part-*.parquet files in {folder}")
        fs, _ = open_fs(folder)
        table = pa.concat_tables(
            pq.read_table(f, columns=["src_ids", "tgt_ids"], filesystem=fs) for f in files
        )
        # uint16 halves the memory of every worker's copy when the vocabulary allows it.
        dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
        sides = []
        for name in ("src_ids", "tgt_ids"):
            arr = table.column(name).combine_chunks()
            offsets = np.asarray(arr.offsets, dtype=np.int64)
            values = np.asarray(arr.values)[offsets[0] : offsets[-1]].astype(dtype)
            sides += [values, offsets - offsets[0]]
        data = cls(*sides)
        for values, name in ((data.src_values, "src_ids"), (data.tgt_values, "tgt_ids")):
            if values.size and int(values.max()) >= vocab_size:
                raise ValueError(
                    f"{folder}: {name} holds id {int(values.max())} >= vocab_size {vocab_size}"
                )
        return data

    def __len__(self) -> int:
        return self.src_offsets.size - 1

    @cached_property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @cached_property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def batch(
        self, rows: np.ndarray, pad_id: int, bos_id: int, pad_multiple: int = 1
    ) -> tuple[torch.Tensor, ...]:
        """``src (B, S)``, ``tgt_in (B, T)``, ``tgt_out (B, T)`` for the given row indices."""
        so, to = self.src_offsets, self.tgt_offsets
        src = [self.src_values[so[i] : so[i + 1]] for i in rows]
        tgt = [self.tgt_values[to[i] : to[i + 1]] for i in rows]
        return collate(src, tgt, pad_id, bos_id, pad_multiple)


class BatchStream:
    """The epochs' seeded batch plans read as one endless stream; ``(epoch, index)`` is the cursor."""

    def __init__(
        self,
        data: TokenData,
        max_tokens: int,
        seed: int,
        epoch: int = 0,
        index: int = 0,
        pad_multiple: int = 1,
    ):
        self.src_lens, self.tgt_lens = data.src_lens, data.tgt_lens
        self.max_tokens, self.seed, self.pad_multiple = max_tokens, seed, pad_multiple
        self.epoch, self.index = epoch, index
        self._plan: list[np.ndarray] | None = None

    def _current(self) -> list[np.ndarray]:
        if self._plan is None:
            self._plan = plan_batches(
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
        return {"epoch": self.epoch, "index": self.index}


def accumulation_steps(tokens_per_step: int, world_size: int, max_tokens_per_batch: int) -> int:
    """Micro-batches per worker per step: ceil(tokens_per_step / (workers * max_tokens))."""
    return max(1, math.ceil(tokens_per_step / (world_size * max_tokens_per_batch)))
