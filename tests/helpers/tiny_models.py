"""Small models and token batches the model and decoding tests share (imported by name: this
folder is on pytest's sys.path)."""

from __future__ import annotations

import torch

from transformer_core import Transformer, presets

V = 40
"""Vocabulary of ``tiny_model()``: the 4 special ids and 36 symbols."""


def tiny_model(seed: int = 0, **changes) -> Transformer:
    """A debug-preset model (max_len 64, vocabulary ``V``) in eval mode, seeded."""
    torch.manual_seed(seed)
    config = presets.debug().replace(max_len=64, **changes)
    return Transformer(config, V).eval()


def tiny_tokens(B: int, T: int, seed: int = 1, first: int | None = None) -> torch.Tensor:
    """(B, T) random symbol ids (no special id), the first column set to ``first`` if given."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (B, T), generator=g)
    if first is not None:
        x[:, 0] = first
    return x


def best_tokens(model: Transformer, src: torch.Tensor, **settings) -> list[list[int]]:
    """The best hypothesis' ids per source row of ``search`` with these ``SearchSettings``."""
    from transformer_core.search import SearchSettings, search

    return [hyps[0].tokens for hyps in search(model, src, SearchSettings(**settings))]
