"""Attention maps for people to look at: the encoder-decoder attention of a trained model over
a few short test sentences, as heat maps (the paper's figures 3-5 show such maps)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from serving.translator import encode_texts

__all__ = ["plot_attention"]

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
        maps = model.cross_attention(torch.tensor([src]), torch.tensor([tgt_in]))
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
