"""Validation while training: loss, NLL and perplexity per target token over the dev batches of
every rank, and how much the encoder's output still depends on its source."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from training.config import TrainConfig
from training.data import TokenData
from training.dev_bleu import DevBleu
from training.distributed import all_reduce_sum
from transformer_core.batching import plan_batches
from transformer_core.loss import label_smoothed_nll
from transformer_core.model import Memory, Transformer


class Validation:
    """What a Trainer validates on: this rank's share of the dev batches (rank ``r`` of ``W``
    takes ``[r::W]``) and, with ``dev_bleu``, the dev subset it translates."""

    def __init__(
        self,
        dev: TokenData,
        config: TrainConfig,
        seed: int,
        rank: int,
        world_size: int,
        dev_bleu: DevBleu | None,
    ):
        self.data, self.dev_bleu = dev, dev_bleu
        self.batches = dev_batches(dev, config, seed)[rank::world_size]

    def run(
        self,
        module: Transformer,
        device: torch.device,
        autocast: Callable[[], AbstractContextManager[Any]],
    ) -> dict[str, float]:
        """``validate``'s metrics and, with ``dev_bleu``, ``val_bleu``: sacreBLEU of greedy
        translations of the dev subset (summed over every rank)."""
        val = validate(module, self.data, self.batches, device, autocast)
        if self.dev_bleu is not None:
            val["val_bleu"] = self.dev_bleu.score(module, device)
        return val


def dev_batches(dev: TokenData, config: TrainConfig, seed: int) -> list[np.ndarray]:
    """The dev split's token-budget batches in order (rank ``r`` of ``W`` takes ``[r::W]``)."""
    return plan_batches(
        dev.src_lens,
        dev.tgt_lens,
        config.eval_tokens,
        seed=seed,
        shuffle=False,
        pad_multiple=config.pad_multiple,
    )


@torch.no_grad()
def validate(
    module: Transformer,
    dev: TokenData,
    batches: list[np.ndarray],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> dict[str, float]:
    """``val_loss``, ``val_nll`` per target token and ``val_ppl`` over every rank's ``batches``
    of ``dev``, and ``val_encoder_spread`` (``encoder_spread``) on each rank's first batch.
    ``module`` is back in training mode afterwards."""
    mc = module.config
    module.eval()
    totals = [torch.zeros((), device=device) for _ in range(5)]
    for i, rows in enumerate(batches):
        src, tgt_in, tgt_out = (t.to(device) for t in dev.batch(rows, mc.pad_id, mc.bos_id))
        with autocast():
            memory = module.encode(src)  # module(src, tgt_in), with the encoder output kept
            logits = module.decode(tgt_in, memory)
            if i == 0:
                totals[3] += encoder_spread(memory)
                totals[4] += 1
        loss, nll, n = label_smoothed_nll(logits, tgt_out, mc.label_smoothing, mc.pad_id)
        totals[0] += loss
        totals[1] += nll
        totals[2] += n
    loss, nll, n, spread, ranks = all_reduce_sum(totals, device)
    module.train()
    n = max(n, 1.0)
    return {
        "val_loss": loss / n,
        "val_nll": nll / n,
        "val_ppl": math.exp(min(nll / n, 50.0)),
        "val_encoder_spread": spread / max(ranks, 1.0),
    }


def encoder_spread(memory: Memory) -> torch.Tensor:
    """How much the encoder's output differs between the positions of a sentence: the mean
    distance of each real position's state from its sentence's mean state, over the mean state
    norm. About 0.5 at initialisation and for a model that reads its source; near 0 when the
    encoder has collapsed to a source-independent output (the decoder then parses or
    translates from its own prefix alone)."""
    states = memory.states.float()  # (B, S, D)
    real = (~memory.src_pad).unsqueeze(-1).float()  # (B, S, 1)
    mean = (states * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp(min=1)
    spread = ((states - mean).norm(dim=-1, keepdim=True) * real).sum() / real.sum().clamp(min=1)
    scale = (states.norm(dim=-1, keepdim=True) * real).sum() / real.sum().clamp(min=1)
    return spread / scale.clamp(min=1e-12)
