"""Stage clean: the raw corpus normalised, filtered and deduplicated (``corpora.cleaning``).

In: ``download`` (the raw corpus folder). Out: ``train/part-*.parquet`` (src, tgt), and
``dev.<lang>``, ``test.<lang>`` normalised line for line; the counts per filter in the manifest
(``dropped.<reason>``, ``corpora.filters.REASONS``; ``too_many_chars`` is ``clean.max_chars``,
the bound on characters per side that the whitespace-token bounds cannot give).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.config import RunConfig, to_dict
from tasks.contract import StageResult, run_stage

log = logging.getLogger(__name__)

STAGE = "clean"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The clean section."""
    return to_dict(config.clean)


def run(config: RunConfig, inputs: Mapping[str, Path], *, force: bool | str = False) -> StageResult:
    """``inputs["download"]`` -> ``<root>/clean``."""
    from corpora.cleaning import clean_corpus
    from tasks.runtime import ensure_ray

    download = Path(inputs["download"])
    src, tgt = config.languages

    def build(tmp: Path) -> dict[str, Any]:
        ensure_ray(config.ray)
        stats = clean_corpus(download, tmp, config.clean, src, tgt)
        log.info("clean: %d of %d pairs kept; dropped %s", stats["kept"], stats["input"], stats["dropped"])
        return stats

    return run_stage(STAGE, config.root / STAGE, stage_config(config), {"download": download}, build, force=force)
