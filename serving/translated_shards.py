"""The files a corpus translation resumes from (``serving.corpus_translation.translate_shards``,
the distill stage's): one ``part-NNNNN.parquet`` per shard of consecutive sentences, gathered
from the rows the translators send back in any order and written once whole, through a
temporary file renamed into place, so a file that exists is a whole shard."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

__all__ = ["SHARD_SCHEMA", "PendingShard", "collect", "shard_name", "write_shard"]

SHARD_SCHEMA = pa.schema(
    [("src", pa.string()), ("tgt", pa.string()), ("score", pa.float64()), ("tgt_len", pa.int32())]
)
"""A translated shard: the source, its translation, the model's mean log-probability per
token of it (EOS counted), and its pieces (EOS not counted)."""


def shard_name(index: int) -> str:
    """The file of shard ``index``."""
    return f"part-{index:05d}.parquet"


@dataclasses.dataclass
class PendingShard:
    """A shard being collected: its sentences and what came back of them so far."""

    start: int
    """Its first row in the corpus."""
    src: list[str]
    tgt: list[str | None]
    score: list[float]
    tgt_len: list[int]
    missing: int
    """Its rows not back yet."""

    @classmethod
    def of(cls, start: int, src: list[str]) -> PendingShard:
        """Shard ``src`` from corpus row ``start``, before any translation came back."""
        size = len(src)
        return cls(start, src, [None] * size, [0.0] * size, [0] * size, size)


def collect(collecting: dict[int, PendingShard], batch: dict[str, np.ndarray]) -> list[int]:
    """Add a batch of translated rows (``piece``: the shard, ``row`` in the corpus, ``tgt``,
    ``score``, ``tgt_len``) to their shards; the shards now whole."""
    for k, row, tgt, score, n in zip(
        batch["piece"], batch["row"], batch["tgt"], batch["score"], batch["tgt_len"], strict=True
    ):
        shard = collecting[int(k)]
        i = int(row) - shard.start
        if shard.tgt[i] is None:
            shard.missing -= 1
        shard.tgt[i], shard.score[i], shard.tgt_len[i] = str(tgt), float(score), int(n)
    return [k for k, shard in collecting.items() if shard.missing == 0]


def write_shard(path: Path, shard: PendingShard) -> None:
    """The shard as Parquet, through a temporary file renamed into place."""
    import pyarrow.parquet as pq

    table = pa.table(
        {"src": shard.src, "tgt": shard.tgt, "score": shard.score, "tgt_len": shard.tgt_len},
        schema=SHARD_SCHEMA,
    )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
