"""Stage shard: the clean corpus encoded with the tokenizer into token-id Parquet shards.

In: ``clean``, ``tokenizer``. Out: ``{train,dev,test}/part-*.parquet`` (``src_ids``,
``tgt_ids``, ``src_len``, ``tgt_len``; pieces + EOS) and ``lengths.png``; the vocabulary size
and per-split lengths in the manifest. The Ray Data encoding is ``corpora.encoding``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.config import RunConfig, to_dict
from tasks.contract import StageResult, run_stage

log = logging.getLogger(__name__)

STAGE = "shard"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The shard section."""
    return to_dict(config.shard)


def run(config: RunConfig, inputs: Mapping[str, Path], *, force: bool = False) -> StageResult:
    """``inputs["clean"]`` + ``inputs["tokenizer"]`` -> ``<root>/shard``."""
    from corpora.encoding import shard_corpus
    from serving import tokenizer
    from tasks.runtime import ensure_ray

    clean, tokenizer_dir = Path(inputs["clean"]), Path(inputs["tokenizer"])
    src, tgt = config.languages

    def build(tmp: Path) -> dict[str, Any]:
        tok = tokenizer.load(tokenizer_dir)  # fails early and clearly if the model is missing
        ensure_ray(config.ray)
        stats = shard_corpus(clean, tok.model_file, tmp, config.shard, src, tgt)
        log.info("shard: %d training rows in %d shards", stats["train"]["rows"], stats["train"]["shards"])
        return {"vocab_size": tok.vocab_size, **stats}

    return run_stage(
        STAGE, config.root / STAGE, stage_config(config), {"clean": clean, "tokenizer": tokenizer_dir},
        build, force=force,
    )
