"""Fine-tuning's start: a parent's weights loaded into a new model of the same shape, and the
parts ``train.freeze`` keeps as the parent trained them. The optimizer and the schedule are the
Trainer's own, made afresh."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from transformer_core import checkpoint
from transformer_core.config import ModelConfig
from transformer_core.model import Transformer

__all__ = ["SHAPELESS", "keep_parent_moments", "shape_mismatch", "start_from_parent"]

SHAPELESS = ("dropout", "attention_dropout", "label_smoothing", "init")
"""Model settings that shape no weight: a fine-tuning may set its own."""


def shape_mismatch(model: ModelConfig, parent: ModelConfig) -> str | None:
    """The settings of ``model`` whose weights would not take ``parent``'s, in one line
    (``model.d_model 128 != parent's 64``); None when the parent's weights fit."""
    skip = set(SHAPELESS)
    if model.positional == parent.positional == "sinusoidal":
        skip.add("max_len")  # the sinusoid table is computed, not stored
    diff = checkpoint.config_diff(model, parent)
    shown = [f"model.{k} {a!r} != parent's {b!r}" for k, (a, b) in diff.items() if k not in skip]
    return "; ".join(shown) or None


def start_from_parent(module: Transformer, weights: Path, freeze: Iterable[str] = ()) -> None:
    """Load the parent's ``weights`` (a checkpoint file) into ``module`` and stop the gradients
    of the parts in ``freeze`` (``embeddings``, ``encoder``)."""
    module.load_state_dict(checkpoint.load(weights)["model"])
    for part in freeze:
        for p in _parameters(module, part):
            p.requires_grad_(False)


def keep_parent_moments(optimizer: torch.optim.Optimizer, weights: Path) -> None:
    """Adam's per-parameter state (moments and step counts) from the parent's checkpoint (a Ray
    Train one, which holds it), under ``optimizer``'s own learning rate and schedule; a
    ValueError when the checkpoint holds weights only."""
    saved = checkpoint.load(weights).get("optimizer")
    if saved is None:
        raise ValueError(f"{weights} holds weights only, no optimizer state")
    fresh = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": saved["state"], "param_groups": fresh})


def _parameters(module: Transformer, part: str) -> Iterable[nn.Parameter]:
    """The parameters of one part of the model (``train.freeze``'s items)."""
    if part == "embeddings":  # the generator is tied to them with share_embeddings
        embeddings = [module.src_embed, module.tgt_embed, getattr(module, "pos_embed", None)]
        return [p for m in embeddings if m is not None for p in m.parameters()]
    if part == "encoder":
        norm = getattr(module, "encoder_norm", None)
        return [*module.encoder_layers.parameters(), *(norm.parameters() if norm else ())]
    raise ValueError(f"{part!r} is not a part train.freeze names (embeddings, encoder)")
