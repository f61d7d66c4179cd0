"""Encoding clean text into token-id shards through a Ray Data actor pool.

Encoding runs in an actor pool (``shard.num_actors`` actors, each loads the sentencepiece model
once) whose actors read ranges of the clean row groups themselves and encode them. The ordered
output streams back to the driver, which writes ``rows_per_shard`` rows per file
(``corpora.parquet``), holding one batch at a time, never the corpus. Each Parquet part gets
an uncompressed Arrow IPC twin with the same rows, ``arrow/<split>/part-*.arrow``, which
training memory-maps (``training.data``).

Shard schema (docs/contracts.md): ``src_ids list<int32>``, ``tgt_ids list<int32>``,
``src_len int32``, ``tgt_len int32``, where ids are the pieces followed by EOS and a length
counts the EOS.

Rows longer than ``max_len`` pieces on either side (the caller passes what the model and one
micro-batch can take) are dropped from train and dev and counted (``dropped_too_long``): the
trainer could never batch them. Test rows are kept line for line and only counted
(``too_long_kept``): translate decodes the test split, one output line per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpora import CorpusError, actor_pools
from corpora.parquet import ParquetShardWriter, part_files
from corpora.pretokenize import Pretokenizer
from corpora.text import read_lines
from filesystem.storage import StoredFolder
from transformer_core.config_checks import ConfigError
from transformer_core.special_ids import EOS_ID

__all__ = [
    "SHARD_SCHEMA",
    "RangeEncoder",
    "ShardConfig",
    "encode_column",
    "encode_table",
    "shard_corpus",
    "too_long",
]


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """Parquet shards written through Ray Data."""

    rows_per_shard: int = 200_000
    """Rows per Parquet file."""
    num_actors: int = 2
    """Encoding actors (each loads the tokenizer once)."""
    batch_size: int = 4096
    """Rows per encoding batch (also the row-group size of the shards)."""
    cpus_per_actor: float = 1.0
    """CPUs reserved per encoding actor (fractions let more actors than CPUs run)."""

    def __post_init__(self) -> None:
        if self.rows_per_shard < 1:
            raise ConfigError("rows_per_shard", f"{self.rows_per_shard} must be >= 1")
        if self.num_actors < 1 or self.batch_size < 1:
            raise ConfigError(
                "num_actors",
                f"num_actors {self.num_actors} and batch_size {self.batch_size} must be >= 1",
            )
        if self.cpus_per_actor <= 0:
            raise ConfigError("cpus_per_actor", f"{self.cpus_per_actor} must be > 0")


# Parquet names a list's item "element"; using that name here too makes the schema read back equal.
_IDS = pa.list_(pa.field("element", pa.int32()))
SHARD_SCHEMA = pa.schema(
    [
        ("src_ids", _IDS),
        ("tgt_ids", _IDS),
        ("src_len", pa.int32()),
        ("tgt_len", pa.int32()),
    ]
)


def encode_column(sp: Any, texts: list[str]) -> tuple[pa.Array, np.ndarray]:
    """Pieces + EOS for each text as an Arrow ``list<int32>``, and the lengths (EOS counted)."""
    pieces = sp.encode(texts)
    n = len(pieces)
    lengths = np.fromiter((len(p) + 1 for p in pieces), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.full(int(offsets[-1]), EOS_ID, dtype=np.int32)
    not_eos = np.ones(len(values), dtype=bool)
    not_eos[offsets[1:] - 1] = False
    values[not_eos] = np.fromiter(
        chain.from_iterable(pieces), dtype=np.int32, count=int(offsets[-1]) - n
    )
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), type=_IDS), lengths


def encode_table(sp: Any, table: pa.Table, pretokenizer: Pretokenizer | None = None) -> pa.Table:
    """A (src, tgt) table as shard rows (each side pretokenized first, if ``pretokenizer``)."""
    src, tgt = table.column("src").to_pylist(), table.column("tgt").to_pylist()
    if pretokenizer:
        src, tgt = pretokenizer.prepare(src, 0), pretokenizer.prepare(tgt, 1)
    src_ids, src_len = encode_column(sp, src)
    tgt_ids, tgt_len = encode_column(sp, tgt)
    return pa.Table.from_arrays(
        [src_ids, tgt_ids, pa.array(src_len), pa.array(tgt_len)], schema=SHARD_SCHEMA
    )


def too_long(table: pa.Table, max_len: int) -> np.ndarray:
    """Mask of the shard rows whose source or target has more than ``max_len`` pieces (EOS
    counted)."""
    src = table.column("src_len").to_numpy()
    tgt = table.column("tgt_len").to_numpy()
    return (src > max_len) | (tgt > max_len)


class _Lengths:
    """Running token counts and a length histogram of one split."""

    def __init__(self) -> None:
        self.rows = 0
        self.tokens = {"src": 0, "tgt": 0}
        self.hist = {"src": np.zeros(1, dtype=np.int64), "tgt": np.zeros(1, dtype=np.int64)}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for side in ("src", "tgt"):
            lengths = table.column(f"{side}_len").to_numpy()
            self.tokens[side] += int(lengths.sum())
            counts = np.bincount(lengths, minlength=len(self.hist[side]))
            counts[: len(self.hist[side])] += self.hist[side]
            self.hist[side] = counts

    def stats(self, files: list[Path]) -> dict[str, Any]:
        def max_len(h: np.ndarray) -> int:
            nz = np.flatnonzero(h)
            return int(nz[-1]) if len(nz) else 0

        return {
            "rows": self.rows,
            "src_tokens": self.tokens["src"],
            "tgt_tokens": self.tokens["tgt"],
            "max_src_len": max_len(self.hist["src"]),
            "max_tgt_len": max_len(self.hist["tgt"]),
            "shards": len(files),
        }


def _train_ranges(files: list[Path], rows_per_range: int, root: Path) -> list[dict[str, Any]]:
    """Consecutive row groups of the clean files, about ``rows_per_range`` rows a range, in
    order; each file named by its path under the clean folder ``root``."""
    import pyarrow.parquet as pq

    items: list[dict[str, Any]] = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        groups: list[int] = []
        rows = 0
        for g in range(meta.num_row_groups):
            groups.append(g)
            rows += meta.row_group(g).num_rows
            if rows >= rows_per_range:
                items.append(
                    {"name": path.relative_to(root).as_posix(), "groups": groups, "rows": rows}
                )
                groups, rows = [], 0
        if groups:
            items.append(
                {"name": path.relative_to(root).as_posix(), "groups": groups, "rows": rows}
            )
    return items


class RangeEncoder:
    """Ray Data actor: loads the tokenizer once (``model_file`` in this node's copy of the
    ``tokenizer`` folder), then reads ranges of clean row groups and encodes them (reading inside
    the actor: only encoded rows cross the object store). The clean files are read straight from
    where the ``clean`` folder is (an object store's: only the row groups a range needs are
    fetched)."""

    def __init__(
        self,
        tokenizer: StoredFolder,
        model_file: str,
        clean: StoredFolder,
        pretokenizer: Pretokenizer | None = None,
    ):
        self.sp = _processor(tokenizer.local() / model_file)
        self.clean, self.pretokenizer = clean, pretokenizer

    def __call__(self, batch: Mapping[str, np.ndarray]) -> pa.Table:
        import pyarrow.parquet as pq

        tables = []
        for name, groups, rows in zip(batch["name"], batch["groups"], batch["rows"], strict=True):
            wanted = [int(g) for g in groups]
            with self.clean.open_input_file(str(name)) as f:
                table = pq.ParquetFile(f).read_row_groups(wanted, columns=["src", "tgt"])
            if table.num_rows != int(rows):  # pragma: no cover - the file changed under us
                raise CorpusError(f"{name} changed while it was being read")
            tables.append(encode_table(self.sp, table, self.pretokenizer))
        return pa.concat_tables(tables)


def _encode_train(
    clean: StoredFolder,
    files: list[Path],
    tokenizer: StoredFolder,
    model_file: str,
    config: ShardConfig,
    pretokenizer: Pretokenizer | None,
) -> Iterator[pa.Table]:
    """Encode the clean training files in an actor pool; the shard rows in input order, batch
    by batch.

    Each input row names a range of consecutive row groups (about 16k rows); ``num_actors``
    ``RangeEncoder`` actors, ``cpus_per_actor`` CPUs each, read and encode the ranges. No read
    tasks run beside the actors, so actors holding every CPU cannot starve them.
    """
    import ray

    rows_per_range = config.batch_size * max(1, 16384 // config.batch_size)
    items = _train_ranges(files, rows_per_range, clean.local())
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        RangeEncoder,
        fn_constructor_kwargs={
            "tokenizer": tokenizer,
            "model_file": model_file,
            "clean": clean,
            "pretokenizer": pretokenizer,
        },
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=max(1, min(config.num_actors, len(items)))),
        num_cpus=config.cpus_per_actor,
        max_restarts=actor_pools.max_restarts(),
    )
    ds.context.execution_options.preserve_order = True
    # Fixed-size batches: row-group boundaries, hence the bytes, depend on the config only.
    yield from ds.iter_batches(batch_size=config.batch_size, batch_format="pyarrow")


def _encode_eval(
    tokenizer: StoredFolder,
    model_file: str,
    table: pa.Table,
    pretokenizer: Pretokenizer | None,
) -> pa.Table:
    """A Ray task: dev and test (small) encoded in one go."""
    return encode_table(_processor(tokenizer.local() / model_file), table, pretokenizer)


def _processor(model_file: str | Path) -> Any:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model_file))


def _write(
    tables: Iterable[pa.Table], out: Path, config: ShardConfig, max_len: int, *, drop: bool
) -> tuple[_Lengths, list[Path], int]:
    """Write one split; the lengths, the files and the rows over ``max_len`` (dropped if
    ``drop``)."""
    # The IPC twins go to <shard>/arrow/<split>/, where training.data.token_files looks.
    ipc_folder = out.parent / "arrow" / out.name
    writer = ParquetShardWriter(out, SHARD_SCHEMA, config.rows_per_shard, ipc_folder=ipc_folder)
    lengths = _Lengths()
    over = 0
    for table in tables:
        mask = too_long(table, max_len)
        over += int(mask.sum())
        if drop and mask.any():
            table = table.filter(pa.array(~mask))
        lengths.add(table)
        writer.write(table)
    return lengths, writer.close(), over


def _read_eval(clean: Path, split: str, src: str, tgt: str) -> pa.Table:
    """A dev/test split as a (src, tgt) table; every line kept (they are references)."""
    sides = [read_lines(clean / f"{split}.{lang}") for lang in (src, tgt)]
    if len(sides[0]) != len(sides[1]):
        raise CorpusError(
            f"{split}.{src} has {len(sides[0])} lines, {split}.{tgt} has {len(sides[1])}"
        )
    return pa.table(
        {"src": pa.array(sides[0], pa.string()), "tgt": pa.array(sides[1], pa.string())}
    )


def plot_lengths(hists: dict[str, np.ndarray], path: Path) -> None:
    """Histogram of training source and target lengths (tokens, EOS counted)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for side, hist in hists.items():
        ax.step(np.arange(len(hist)), hist, where="mid", label=side)
    ax.set_xlabel("tokens per sentence (EOS included)")
    ax.set_ylabel("sentences")
    ax.set_title("training lengths")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})


def shard_corpus(
    clean: StoredFolder,
    tokenizer: StoredFolder,
    model_file: str,
    out: Path,
    config: ShardConfig,
    src: str,
    tgt: str,
    *,
    max_len: int,
    pretokenizer: Pretokenizer | None = None,
) -> dict[str, Any]:
    """Encode the clean folder (``train/part-*.parquet``, ``dev.*``, ``test.*``) with the
    sentencepiece model ``model_file`` of the ``tokenizer`` folder (after ``pretokenizer``, if
    given) into ``out/{train,dev,test}/part-*.parquet`` and their IPC twins
    ``out/arrow/{train,dev,test}/part-*.arrow``, dropping train and dev rows over ``max_len``
    pieces; the stats per split and ``lengths.png``. Needs a running Ray: each task reads its
    node's copy of the tokenizer, and the actors read the clean training rows where they are."""
    import ray

    root, out = clean.local(), Path(out)
    train_files = part_files(root / "train")
    stats: dict[str, Any] = {}
    # dev and test together, in one task that runs beside the training split; split again by
    # row count
    evals = {split: _read_eval(root, split, src, tgt) for split in ("dev", "test")}
    eval_ref = ray.remote(num_cpus=min(1.0, config.cpus_per_actor))(_encode_eval).remote(
        tokenizer, model_file, pa.concat_tables(list(evals.values())), pretokenizer
    )
    train_lengths, files, over = _write(
        _encode_train(clean, train_files, tokenizer, model_file, config, pretokenizer),
        out / "train",
        config,
        max_len,
        drop=True,
    )
    stats["train"] = {**train_lengths.stats(files), "dropped_too_long": over}
    if train_lengths.rows == 0 and over:
        raise CorpusError(
            f"all {over} training rows are longer than {max_len} pieces, the most the model "
            "and one micro-batch take (model.max_len, train.max_tokens_per_batch)"
        )
    encoded = ray.get(eval_ref)
    offset = 0
    for split, table in evals.items():
        drop = split == "dev"  # test stays line for line: translate decodes every row
        lengths, files, over = _write(
            [encoded.slice(offset, table.num_rows)], out / split, config, max_len, drop=drop
        )
        stats[split] = {
            **lengths.stats(files),
            ("dropped_too_long" if drop else "too_long_kept"): over,
        }
        offset += table.num_rows
    plot_lengths(train_lengths.hist, out / "lengths.png")
    return stats
