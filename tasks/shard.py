"""Stage shard: the clean corpus encoded with the tokenizer into token-id Parquet shards.

In: ``clean``, ``tokenizer``. Out: ``{train,dev,test}/part-*.parquet`` (``src_ids``,
``tgt_ids``, ``src_len``, ``tgt_len``; pieces + EOS), beside each part its uncompressed Arrow
IPC twin ``part-*.arrow`` (the same rows, memory-mapped by training), and ``lengths.png``; the
vocabulary size and per-split lengths in the manifest. The Ray Data encoding is
``corpora.encoding``.

Train and dev rows with more pieces (EOS included) on either side than ``max_pieces`` =
min(``model.max_len``, ``train.max_tokens_per_batch``) are dropped and counted per split
(``dropped_too_long``): the model has no positions past ``max_len`` and a row must fit one
micro-batch. The limit is in the fingerprint, so changing it reshards. Test rows are all kept
(``too_long_kept`` counts those over the limit): translate decodes the test split line for line.
Each split is written twice, Parquet for Ray Data and Arrow IPC for training's memory maps
(docs/contracts.md says why one format does not serve both).
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext

log = logging.getLogger(__name__)

STAGE = "shard"


def max_pieces(config: RunConfig) -> int:
    """The most pieces per side a train or dev row may have: what the model and one micro-batch
    take."""
    return min(config.model.max_len, config.train.max_tokens_per_batch)


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The shard section and the row limit (``max_pieces``)."""
    return {**to_dict(config.shard), "max_pieces": max_pieces(config)}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["clean"]`` + ``inputs["tokenizer"]`` -> the shards in ``ctx.tmp``."""
    from corpora.encoding import shard_corpus
    from serving import tokenizer
    from tasks.framework.runtime import ensure_ray

    config, tmp = ctx.config, ctx.tmp
    tokenizer_dir = ctx.inputs["tokenizer"]
    src, tgt = config.languages
    tok = tokenizer.load(tokenizer_dir)  # fails early and clearly if the model is missing
    ensure_ray(config.ray)
    limit = max_pieces(config)
    stats = shard_corpus(
        ctx.stored["clean"],
        ctx.stored["tokenizer"],
        tok.model_file.relative_to(tokenizer_dir).as_posix(),
        tmp,
        config.shard,
        src,
        tgt,
        max_len=limit,
        pretokenizer=tok.pretokenizer,
    )
    log.info(
        "shard: %d training rows in %d shards; %d train and %d dev rows over %d pieces dropped",
        stats["train"]["rows"],
        stats["train"]["shards"],
        stats["train"]["dropped_too_long"],
        stats["dev"]["dropped_too_long"],
        limit,
    )
    return {"vocab_size": tok.vocab_size, "max_pieces": limit, **stats}
