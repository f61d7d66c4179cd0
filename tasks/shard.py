"""Stage 4, shard: encode the clean corpus with the tokenizer into Parquet shards, through Ray Data.

Encoding runs in an actor pool (``shard.num_actors`` actors, each loads the sentencepiece model
once) whose actors read ranges of the clean row groups themselves and encode them. The ordered
output streams back to the driver, which writes ``rows_per_shard`` rows per file with pyarrow:
Ray Data's own writer names and sizes files by task, so byte-identical reruns are easiest to
guarantee this way, and the driver holds one batch at a time, never the corpus.

Shard schema (docs/contracts.md): ``src_ids list<int32>``, ``tgt_ids list<int32>``,
``src_len int32``, ``tgt_len int32``, where ids are the pieces followed by EOS and a length
counts the EOS.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.artifacts import StageError, run_stage
from tasks.clean import ParquetShardWriter, languages
from tasks.config import ShardConfig
from transformer_core.config import EOS_ID

log = logging.getLogger(__name__)

__all__ = ["SHARD_SCHEMA", "encode_column", "encode_table", "RangeEncoder", "shard_corpus", "stage_config", "run"]

# Parquet names a list's item "element"; using that name here too makes the schema read back equal.
_IDS = pa.list_(pa.field("element", pa.int32()))
SHARD_SCHEMA = pa.schema([
    ("src_ids", _IDS),
    ("tgt_ids", _IDS),
    ("src_len", pa.int32()),
    ("tgt_len", pa.int32()),
])


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
    values[not_eos] = np.fromiter(chain.from_iterable(pieces), dtype=np.int32, count=int(offsets[-1]) - n)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), type=_IDS), lengths


def encode_table(sp: Any, table: pa.Table) -> pa.Table:
    """A (src, tgt) table as shard rows."""
    src_ids, src_len = encode_column(sp, table.column("src").to_pylist())
    tgt_ids, tgt_len = encode_column(sp, table.column("tgt").to_pylist())
    return pa.Table.from_arrays([src_ids, tgt_ids, pa.array(src_len), pa.array(tgt_len)], schema=SHARD_SCHEMA)


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


def _train_ranges(files: list[Path], rows_per_range: int) -> list[dict[str, Any]]:
    """Consecutive row groups of the clean files, about ``rows_per_range`` rows a range, in order."""
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
                items.append({"path": str(path), "groups": groups, "rows": rows})
                groups, rows = [], 0
        if groups:
            items.append({"path": str(path), "groups": groups, "rows": rows})
    return items


class RangeEncoder:
    """Ray Data actor: loads the tokenizer once, then reads ranges of clean row groups and
    encodes them (reading inside the actor: only encoded rows cross the object store)."""

    def __init__(self, model_file: str):
        from tasks.tokenizer import Tokenizer

        self.sp = Tokenizer(Path(model_file)).sp

    def __call__(self, batch: Mapping[str, np.ndarray]) -> pa.Table:
        import pyarrow.parquet as pq

        tables = []
        for path, groups, rows in zip(batch["path"], batch["groups"], batch["rows"], strict=True):
            table = pq.ParquetFile(str(path)).read_row_groups([int(g) for g in groups], columns=["src", "tgt"])
            if table.num_rows != int(rows):  # pragma: no cover - the file changed under us
                raise StageError(f"shard: {path} changed while it was being read")
            tables.append(encode_table(self.sp, table))
        return pa.concat_tables(tables)


def _encode_train(files: list[Path], model_file: Path, config: ShardConfig) -> Iterator[pa.Table]:
    """Encode the clean training files in an actor pool; the shard rows in input order, batch by batch.

    Each input row names a range of consecutive row groups (about 16k rows); ``num_actors``
    ``RangeEncoder`` actors, ``cpus_per_actor`` CPUs each, read and encode the ranges. No read
    tasks run beside the actors, so actors holding every CPU cannot starve them.
    """
    import ray

    rows_per_range = config.batch_size * max(1, 16384 // config.batch_size)
    items = _train_ranges(files, rows_per_range)
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        RangeEncoder,
        fn_constructor_kwargs={"model_file": str(model_file)},
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=max(1, min(config.num_actors, len(items)))),
        num_cpus=config.cpus_per_actor,
    )
    ds.context.execution_options.preserve_order = True
    # Fixed-size batches: row-group boundaries, hence the bytes, depend on the config only.
    yield from ds.iter_batches(batch_size=config.batch_size, batch_format="pyarrow")


def _encode_eval(model_file: str, table: pa.Table) -> pa.Table:
    """A Ray task: dev and test (small) encoded in one go."""
    from tasks.tokenizer import Tokenizer

    return encode_table(Tokenizer(Path(model_file)).sp, table)


def _write(tables: Iterable[pa.Table], out: Path, config: ShardConfig) -> tuple[_Lengths, list[Path]]:
    writer = ParquetShardWriter(out, SHARD_SCHEMA, config.rows_per_shard)
    lengths = _Lengths()
    for table in tables:
        lengths.add(table)
        writer.write(table)
    return lengths, writer.close()


def _read_eval(clean: Path, split: str, src: str, tgt: str) -> pa.Table:
    """A dev/test split as a (src, tgt) table; every line kept (they are references)."""
    sides = []
    for lang in (src, tgt):
        path = clean / f"{split}.{lang}"
        if not path.is_file():
            raise StageError(f"shard: {path} is missing")
        sides.append(path.read_text(encoding="utf-8").split("\n")[:-1])
    if len(sides[0]) != len(sides[1]):
        raise StageError(f"shard: {split}.{src} has {len(sides[0])} lines, {split}.{tgt} has {len(sides[1])}")
    return pa.table({"src": pa.array(sides[0], pa.string()), "tgt": pa.array(sides[1], pa.string())})


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


def shard_corpus(clean: Path, tokenizer: Path, out: Path, config: ShardConfig, src: str, tgt: str) -> dict[str, Any]:
    """Encode ``clean`` (train/*.parquet, dev.*, test.*) into shards under ``out``; the stats."""
    import ray

    from tasks.tokenizer import MODEL_FILE, load

    clean, out = Path(clean), Path(out)
    vocab_size = load(tokenizer).vocab_size  # fails early and clearly if the model is missing
    model_file = Path(tokenizer) / MODEL_FILE
    train_files = sorted((clean / "train").glob("*.parquet"))
    if not train_files:
        raise StageError(f"shard: no training data in {clean / 'train'}")
    stats: dict[str, Any] = {"vocab_size": vocab_size}
    # dev and test together, in one task that runs beside the training split; split again by row count
    evals = {split: _read_eval(clean, split, src, tgt) for split in ("dev", "test")}
    eval_ref = ray.remote(num_cpus=min(1.0, config.cpus_per_actor))(_encode_eval).remote(
        str(model_file), pa.concat_tables(list(evals.values()))
    )
    train_lengths, files = _write(_encode_train(train_files, model_file, config), out / "train", config)
    stats["train"] = train_lengths.stats(files)
    encoded = ray.get(eval_ref)
    offset = 0
    for split, table in evals.items():
        lengths, files = _write([encoded.slice(offset, table.num_rows)], out / split, config)
        stats[split] = lengths.stats(files)
        offset += table.num_rows
    plot_lengths(train_lengths.hist, out / "lengths.png")
    return stats


def stage_config(config: Any) -> ShardConfig:
    """What the stage fingerprints besides its inputs: the shard section."""
    return config.shard


def run(config: Any, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Run the shard stage: ``inputs["clean"]`` + ``inputs["tokenizer"]`` -> ``<root>/shard``."""
    from tasks.runtime import ensure_ray

    clean, tokenizer = Path(inputs["clean"]), Path(inputs["tokenizer"])
    src, tgt = languages(config)

    def build(tmp: Path) -> dict[str, Any]:
        ensure_ray(config.ray)
        stats = shard_corpus(clean, tokenizer, tmp, config.shard, src, tgt)
        log.info("shard: %d training rows in %d shards", stats["train"]["rows"], stats["train"]["shards"])
        return stats

    return run_stage(
        "shard", config.root / "shard", stage_config(config), {"clean": clean, "tokenizer": tokenizer},
        build, force=force,
    )
