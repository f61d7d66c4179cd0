"""Stage average: the mean of the last N checkpoints' weights (paper section 6.1), or the best
checkpoint by dev BLEU (``average.select: best``).

In: ``train`` (``checkpoints.json`` and the checkpoints it lists). Out: ``model.pt``.

The paper averages the last 5 checkpoints of the base model, "written at 10-minute intervals",
and the last 20 of the big model. ``average.spacing: step`` takes the last N the train stage
kept; ``spacing: time`` walks back from the newest and takes checkpoints at least
``train.checkpoint_minutes`` apart (so an extra step-triggered checkpoint does not crowd out
the 10-minute ones).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "average"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The averaging settings and the spacing that ``spacing: time`` uses."""
    return {
        "average": to_dict(config.average),
        "checkpoint_minutes": config.train.checkpoint_minutes,
    }


def pick_checkpoints(
    entries: Sequence[Mapping[str, Any]], last: int, spacing: str, minutes: float = 0.0
) -> list[Mapping[str, Any]]:
    """The checkpoints to average, in increasing step order.

    ``entries`` carry ``step`` and ``time`` (seconds). ``spacing="step"``: the ``last`` with the
    highest steps. ``spacing="time"``: the newest, then walking back, each next one at least
    ``minutes`` older than the one taken before it, up to ``last`` of them.
    """
    if last < 1:
        raise ValueError(f"last={last} must be >= 1")
    ordered = sorted(entries, key=lambda e: e["step"])
    if spacing == "step":
        return ordered[-last:]
    if spacing != "time":
        raise ValueError(f"spacing {spacing!r} is not 'step' or 'time'")
    picked: list[Mapping[str, Any]] = []
    for entry in reversed(ordered):
        if len(picked) == last:
            break
        if not picked or picked[-1]["time"] - entry["time"] >= 60.0 * minutes:
            picked.append(entry)
    return picked[::-1]


def build(ctx: BuildContext) -> dict[str, Any]:
    """Average the train stage's checkpoints into ``ctx.tmp/model.pt``."""
    from transformer_core import checkpoint
    from transformer_core.averaging import average_checkpoints
    from transformer_core.config import ModelConfig

    config, train_dir, tmp = ctx.config, ctx.inputs["train"], ctx.tmp
    listing_file = train_dir / "checkpoints.json"
    if not listing_file.is_file():
        raise StageError(f"{listing_file} does not exist (run `tfm stage train` first)")
    listing = json.loads(listing_file.read_text())
    entries = listing["checkpoints"]
    if not entries:
        raise StageError(f"{listing_file} lists no checkpoints: nothing to average")
    avg = config.average
    if avg.select == "best":
        if "best" not in listing:
            raise StageError(
                f"average.select: best, but {listing_file} has no best checkpoint "
                "(train.bleu_sentences was 0)"
            )
        chosen = [listing["best"]]
    else:
        chosen = pick_checkpoints(entries, avg.last, avg.spacing, config.train.checkpoint_minutes)
    paths = [train_dir / e["path"] for e in chosen]
    state = average_checkpoints(paths)
    newest = checkpoint.load(paths[-1])
    checkpoint.save(
        tmp / checkpoint.MODEL_FILE,
        state,
        ModelConfig.from_dict(newest["config"]),
        vocab_size=newest["vocab_size"],
        tgt_vocab_size=newest.get("tgt_vocab_size"),
        averaged_steps=[int(e["step"]) for e in chosen],
    )
    stats: dict[str, Any] = {
        "steps": [int(e["step"]) for e in chosen],
        "sources": [e["path"] for e in chosen],
        "count": len(chosen),
        "requested": avg.last,
        "spacing": avg.spacing,
        "select": avg.select,
    }
    if avg.select == "best":
        stats["val_bleu"] = chosen[0]["val_bleu"]
    elif len(chosen) < avg.last:
        stats["warning"] = (
            f"averaged {len(chosen)} checkpoint(s), fewer than average.last={avg.last}"
            + (
                f" spaced {config.train.checkpoint_minutes:g} min apart"
                if avg.spacing == "time"
                else ""
            )
        )
        log.warning("average: %s", stats["warning"])
    return stats
