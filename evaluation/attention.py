"""Attention maps for people to look at: the encoder-decoder attention of a trained model over
a few short test sentences, as heat maps (the paper's figures 3-5 show such maps)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.translator import encode_texts

__all__ = ["cross_attention_maps", "plot_attention"]

log = logging.getLogger(__name__)


def plot_attention(
    weights: Path,
    tokenizer_dir: Path,
    src_ids: Sequence[Sequence[int]],
    hyps: Sequence[str],
    path: Path,
    *,
    n: int = 4,
    max_src: int = 30,
    max_tgt: int = 40,
) -> int:
    """Heat maps of the last decoder layer's encoder-decoder attention (mean over heads) for the
    first ``n`` test sentences short enough to read (pieces on the axes); how many were drawn.
    ``src_ids`` are the encoded sources, ``hyps`` their translations as text."""
    import torch
    from matplotlib.figure import Figure

    from serving import tokenizer as tokenizer_lib
    from transformer_core import checkpoint

    tok = tokenizer_lib.load(Path(tokenizer_dir))
    picked = []
    for src, hyp in zip(src_ids, hyps, strict=True):
        if not 2 <= len(src) <= max_src:
            continue
        tgt = encode_texts(tok, [hyp])[0]
        if 2 <= len(tgt) <= max_tgt:
            picked.append((list(src), tgt))
        if len(picked) == n:
            break
    if not picked:
        log.info("translate: no test sentence short enough for the attention plot")
        return 0
    model = checkpoint.load_model(weights, None, map_location="cpu")
    fig = Figure(figsize=(6 * len(picked), 6))
    axes = fig.subplots(1, len(picked), squeeze=False)[0]
    for ax, (src, tgt) in zip(axes, picked, strict=True):
        tgt_in = [model.config.bos_id] + tgt[:-1]  # the decoder input that predicts tgt
        maps = cross_attention_maps(model, torch.tensor([src]), torch.tensor([tgt_in]))
        w = maps[-1][0].mean(dim=0).numpy()  # (T, S), last layer, mean over heads
        ax.imshow(w, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(src)), [tok.sp.id_to_piece(i) for i in src], rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)), [tok.sp.id_to_piece(i) for i in tgt], fontsize=7)
        ax.set_xlabel("source pieces")
        ax.set_ylabel("output pieces")
    fig.suptitle(f"encoder-decoder attention, layer {model.config.n_layers} (mean of heads)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    return len(picked)


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
