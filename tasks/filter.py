"""Stage filter: the teacher's translations less those it scored worst (the distill pipeline).

In: ``distill`` (``train/part-*.parquet``: ``src``, ``tgt``, ``score``, ``tgt_len``), ``clean``
(its dev and test sets). Out: the clean stage's layout, so the usual tokenizer and shard stages
read it under the role ``clean``: ``train/part-*.parquet`` (``src``, ``tgt``) in corpus order,
and ``dev.<lang>``, ``test.<lang>`` copied from clean (the student is chosen and scored on the
references, never on the teacher's output). Dropped: every empty translation, then the
``distill.drop_share`` of the rest whose score (the teacher's mean log-probability per token of
its own output) is lowest; the counts and the threshold go to the manifest.

The score is the teacher's own: mozilla/translations scores the pairs with a separate model
(a cross-entropy filter); this one needs no second model and is what the search computed.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "filter"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The share dropped and the rows per output file."""
    return {"drop_share": config.distill.drop_share, "rows_per_file": config.clean.rows_per_file}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["distill"]`` filtered into ``ctx.tmp/train``, beside clean's dev and test sets."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpora.parquet import TEXT_SCHEMA, ParquetShardWriter, part_files
    from corpora.score_filter import worst

    config, tmp = ctx.config, ctx.tmp
    parts = part_files(ctx.inputs["distill"] / "train")
    columns = [pq.read_table(f, columns=["score", "tgt_len"]) for f in parts]
    scores = np.concatenate([t.column("score").to_numpy() for t in columns])
    empty = np.concatenate([t.column("tgt_len").to_numpy() == 0 for t in columns])
    dropped = worst(scores, config.distill.drop_share, keep=~empty)
    keep = ~(empty | dropped)
    if not keep.any():
        raise StageError(f"filter: no pair of the {len(keep)} in {ctx.inputs['distill']} is kept")
    writer = ParquetShardWriter(tmp / "train", TEXT_SCHEMA, config.clean.rows_per_file)
    start = 0
    for f, t in zip(parts, columns, strict=True):
        rows = pq.read_table(f, columns=["src", "tgt"])
        writer.write(rows.filter(pa.array(keep[start : start + t.num_rows])))
        start += t.num_rows
    files = writer.close()
    for split in ("dev", "test"):
        for lang in config.languages:
            shutil.copy2(ctx.inputs["clean"] / f"{split}.{lang}", tmp / f"{split}.{lang}")
    threshold = float(scores[dropped].max()) if dropped.any() else None
    log.info(
        "filter: %d of %d pairs kept; dropped %d empty and %d scored at most %s",
        int(keep.sum()),
        len(keep),
        int(empty.sum()),
        int(dropped.sum()),
        "-" if threshold is None else f"{threshold:.3f}",
    )
    return {
        "input": len(keep),
        "kept": int(keep.sum()),
        "dropped": {"empty": int(empty.sum()), "worst": int(dropped.sum())},
        "threshold": threshold,
        "mean_score_kept": round(float(scores[keep].mean()), 4),
        "train_files": len(files),
    }
