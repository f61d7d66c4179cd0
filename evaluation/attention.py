"""Attention maps for people to look at: the encoder-decoder attention of a trained model over
a few short test sentences, as heat maps (the paper's figures 3-5 show such maps).

The maps are computed where the model is already loaded (the translate stage's Ray Data
actors, ``attention_map``) and drawn on the driver (``draw_attention``), which loads no model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.translator import TorchEngine, Translator, encode_texts

__all__ = [
    "AttentionMap",
    "attention_map",
    "cross_attention_maps",
    "draw_attention",
    "short_enough",
]

log = logging.getLogger(__name__)

MAX_SRC = 30
"""The longest source (pieces, EOS counted) drawn: longer ones do not read as a heat map."""
MAX_TGT = 40
"""The longest output (pieces, EOS counted) drawn."""


@dataclass(frozen=True)
class AttentionMap:
    """One sentence's map: the last decoder layer's attention, mean over heads, (T, S)."""

    src_pieces: list[str]
    tgt_pieces: list[str]
    weights: np.ndarray
    layer: int
    """The layer drawn (the last: the model's decoder layer count)."""


def short_enough(src_len: int) -> bool:
    """Whether a source of ``src_len`` pieces (EOS counted) may be drawn."""
    return 2 <= src_len <= MAX_SRC


def attention_map(translator: Translator, src: Sequence[int], hyp: str) -> AttentionMap | None:
    """The map of source ids ``src`` and their translation ``hyp`` (text, encoded again as the
    tokenizer reads it) by the translator's torch model, on its own device and dtype; None when
    either side is too short or too long to draw, or the engine holds no torch model
    (ctranslate2). A ``serving.corpus_translation.Probe``: the translate stage's actors call it."""
    import torch

    if not isinstance(translator.engine, TorchEngine):
        return None
    model, tokenizer = translator.engine.model, translator.tokenizer
    tgt = encode_texts(tokenizer, [hyp])[0]
    if not (short_enough(len(src)) and 2 <= len(tgt) <= MAX_TGT):
        return None
    device = next(model.parameters()).device
    tgt_in = [model.config.bos_id] + tgt[:-1]  # the decoder input that predicts tgt
    maps = cross_attention_maps(
        model, torch.tensor([list(src)], device=device), torch.tensor([tgt_in], device=device)
    )
    weights = maps[-1][0].mean(dim=0).float().cpu().numpy()  # (T, S), last layer, mean over heads
    pieces = tokenizer.sp.id_to_piece
    return AttentionMap(
        [pieces(int(i)) for i in src],
        [pieces(int(i)) for i in tgt],
        weights,
        int(model.config.n_decoder_layers),
    )


def draw_attention(maps: Sequence[AttentionMap], path: Path) -> int:
    """Heat maps of ``maps`` side by side in one PNG at ``path``; how many were drawn."""
    from matplotlib.figure import Figure

    if not maps:
        log.info("translate: no test sentence short enough for the attention plot")
        return 0
    fig = Figure(figsize=(6 * len(maps), 6))
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, m in zip(axes, maps, strict=True):
        ax.imshow(m.weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(m.src_pieces)), m.src_pieces, rotation=90, fontsize=7)
        ax.set_yticks(range(len(m.tgt_pieces)), m.tgt_pieces, fontsize=7)
        ax.set_xlabel("source pieces")
        ax.set_ylabel("output pieces")
    fig.suptitle(f"encoder-decoder attention, layer {maps[0].layer} (mean of heads)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    return len(maps)


def cross_attention_maps(model: Any, src: Any, tgt_in: Any) -> list[Any]:
    """Encoder-decoder attention probabilities of a teacher-forced pass of ``model`` (a
    ``transformer_core`` Transformer), per decoder layer: (B, nh, T, S) each, rows summing to 1
    over the real source positions. Runs in eval mode and restores the mode after."""
    import torch

    captured: list[Any] = []

    def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        x, k = args[0], args[1]
        captured.append(module.weights(x, k, kwargs.get("mask")))

    was_training = model.training
    handles = [
        layer.cross_attn.register_forward_hook(hook, with_kwargs=True)
        for layer in model.decoder_layers
    ]
    try:
        model.eval()
        with torch.no_grad():
            model(src, tgt_in)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return captured
