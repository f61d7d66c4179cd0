"""Stage linearize: treebank trees as (words, linearized tree) pairs, in the clean stage's layout
so that the tokenizer and shard stages read them unchanged (``parsing.linearize``).

In: ``treebank``. Out: ``train/part-*.parquet`` (src, tgt; the silver corpus after the gold
trees in the semi-supervised setting), ``{dev,test}.words``, ``{dev,test}.tree``, and
``gold.trees`` (the test split) for scoring.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

STAGE = "linearize"
ROWS_PER_PART = 1_000_000
"""Training rows per Parquet file (the silver corpus of the semi-supervised setting is ~17M)."""
BATCH = 50_000
"""Rows per row group."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The form and the silver corpus (its path and bytes)."""
    from tasks.framework.content import file_digests

    silver = config.parsing.silver_corpus
    info = None
    if silver:
        path = Path(silver)
        info = {
            "path": str(path),
            "sha256": (file_digests([path], path.parent) or {}).get(path.name),
        }
    return {"form": config.parsing.form, "silver_corpus": info}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["treebank"]`` -> the linearized corpus in ``ctx.tmp``."""
    from corpora.parquet import TEXT_SCHEMA, ParquetShardWriter
    from parsing.linearize import pairs
    from parsing.trees import read_trees

    treebank, tmp, parsing = ctx.inputs["treebank"], ctx.tmp, ctx.config.parsing
    form = parsing.form
    silver = Path(parsing.silver_corpus) if parsing.silver_corpus else None
    if silver is not None and not silver.is_file():
        raise StageError(f"parsing.silver_corpus: {silver} is not a file")
    stats: dict[str, Any] = {"form": form}
    writer = ParquetShardWriter(tmp / "train", TEXT_SCHEMA, ROWS_PER_PART)
    stats.update(_write(writer, pairs(read_trees(treebank / "train.trees"), form), "train"))
    if silver is not None:
        stats.update(_write(writer, pairs(read_trees(silver, clean=True), form), "silver"))
    stats["parts"] = len(writer.close())
    for split in ("dev", "test"):
        n = 0
        with (
            open(tmp / f"{split}.words", "w", encoding="utf-8") as src_out,
            open(tmp / f"{split}.tree", "w", encoding="utf-8") as tgt_out,
        ):
            for src, tgt in pairs(read_trees(treebank / f"{split}.trees"), form):
                src_out.write(src + "\n")
                tgt_out.write(tgt + "\n")
                n += 1
        stats[f"{split}_pairs"] = n
    shutil.copyfile(treebank / "test.trees", tmp / "gold.trees")
    return stats


def _write(writer: Any, rows: Iterable[tuple[str, str]], name: str) -> dict[str, Any]:
    """Append (src, tgt) rows in row groups of ``BATCH``; their count and lengths (tokens)."""
    import pyarrow as pa

    count = src_tokens = tgt_tokens = max_src = max_tgt = 0
    src: list[str] = []
    tgt: list[str] = []
    for s, t in rows:
        src.append(s)
        tgt.append(t)
        n_src, n_tgt = s.count(" ") + 1, t.count(" ") + 1
        src_tokens, tgt_tokens = src_tokens + n_src, tgt_tokens + n_tgt
        max_src, max_tgt = max(max_src, n_src), max(max_tgt, n_tgt)
        if len(src) == BATCH:
            writer.write(pa.table({"src": src, "tgt": tgt}))
            count += len(src)
            src, tgt = [], []
    if src:
        writer.write(pa.table({"src": src, "tgt": tgt}))
        count += len(src)
    return {
        f"{name}_pairs": count,
        f"{name}_max_src_len": max_src,
        f"{name}_max_tgt_len": max_tgt,
        f"{name}_tgt_per_src": round(tgt_tokens / src_tokens, 3) if src_tokens else 0.0,
    }
