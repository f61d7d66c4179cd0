"""Stage holdout: the clean corpus less the training pairs of the test sets held out.

In: ``clean`` (the clean layout). Out: the same layout, ``train/part-*.parquet`` (``src``,
``tgt``) without every pair whose source or target is a sentence of a set of ``eval.test_sets``
with ``holdout`` (either side, normalised as clean normalises, as clean removes the dev and test
sets' own), and clean's ``dev.<l>`` and ``test.<l>`` as they are; the pairs dropped in the
manifest. The graph runs it only for a config that holds a set out, and the stages after it
read it as clean: a config without such sets trains on clean's folder, as before.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext

log = logging.getLogger(__name__)

STAGE = "holdout"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The pair and each held-out set (a prefix's files by their bytes)."""
    from tasks.evaluate import set_identity

    sets = [set_identity(config, s) for s in config.eval.held_out]
    return {"pair": config.data.pair, "mirror": config.data.mirror, "sets": sets}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["clean"]`` less the held-out sets' pairs into ``ctx.tmp``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from corpora.parquet import TEXT_SCHEMA, ParquetShardWriter, part_files
    from tasks.evaluate import normalised, read_set
    from tasks.framework.manifest import MANIFEST

    config, tmp, clean = ctx.config, ctx.tmp, ctx.inputs["clean"]
    sentences: set[str] = set()
    for s in config.eval.held_out:
        files = read_set(ctx, s, tmp / "sets" / s.name)
        for path in files.values():
            sentences.update(normalised(path.read_text(encoding="utf-8").splitlines()))
    shutil.rmtree(tmp / "sets")
    sentences.discard("")
    held = pa.array(sorted(sentences), pa.string())
    writer = ParquetShardWriter(tmp / "train", TEXT_SCHEMA, config.clean.rows_per_file)
    seen = kept = 0
    for part in part_files(clean / "train"):
        table = pq.read_table(part, columns=["src", "tgt"]).cast(TEXT_SCHEMA)
        hit = pc.or_(pc.is_in(table["src"], value_set=held), pc.is_in(table["tgt"], value_set=held))
        table = table.filter(pc.invert(hit))
        seen, kept = seen + len(hit), kept + table.num_rows
        if table.num_rows:
            writer.write(table)
    files = writer.close()
    for path in sorted(clean.iterdir()):  # dev and test sets, line for line
        if path.is_file() and path.name != MANIFEST:
            shutil.copyfile(path, tmp / path.name)
    log.info(
        "holdout: %d of %d training pairs hold a sentence of %s; %d kept",
        seen - kept,
        seen,
        ", ".join(s.name for s in config.eval.held_out),
        kept,
    )
    return {"input": seen, "dropped": seen - kept, "kept": kept, "train_files": len(files)}
