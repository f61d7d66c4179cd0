"""Stage clean: the raw corpus normalised, filtered and deduplicated (``corpora.cleaning``).

In: ``download`` (the raw corpus folder). Out: ``train/part-*.parquet`` (src, tgt), and
``dev.<lang>``, ``test.<lang>`` normalised line for line; the counts per filter in the manifest
(``dropped.<reason>``, ``corpora.filters.REASONS``; ``too_many_chars`` is ``clean.max_chars``,
the bound on characters per side that the whitespace-token bounds cannot give).
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext

log = logging.getLogger(__name__)

STAGE = "clean"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The clean section."""
    return to_dict(config.clean)


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["download"]`` -> the clean corpus in ``ctx.tmp``."""
    from corpora.cleaning import clean_corpus
    from tasks.framework.runtime import ensure_ray

    config = ctx.config
    src, tgt = config.languages
    ensure_ray(config.ray)
    stats = clean_corpus(ctx.stored["download"], ctx.tmp, config.clean, src, tgt)
    log.info(
        "clean: %d of %d pairs kept; dropped %s", stats["kept"], stats["input"], stats["dropped"]
    )
    return stats
