"""Model FLOPs: the analytic count equals PyTorch's FLOP counter on the real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transformer_core import Transformer
from transformer_core.config import ModelConfig
from transformer_core.flops import forward_flops, peak_flops, train_flops


@pytest.mark.parametrize(
    ("config", "vocab", "tgt_vocab"),
    [
        (ModelConfig(n_layers=2, d_model=32, d_ff=48, n_heads=4), 50, None),
        # Table 3 row A/B shapes: per-head widths apart from d_model / h; untied vocabularies.
        (ModelConfig(n_layers=1, d_model=24, d_ff=40, n_heads=3, d_k=5, d_v=7), 40, 60),
        # A distillation student's shape: a deeper encoder than decoder.
        (ModelConfig(n_layers=3, decoder_layers=1, d_model=32, d_ff=48, n_heads=4), 50, None),
    ],
)
@pytest.mark.parametrize(("S", "T"), [(7, 5), (2, 13)])
def test_forward_and_training_flops_match_torchs_flop_counter(config, vocab, tgt_vocab, S, T):
    model = Transformer(config, vocab, tgt_vocab)
    src = torch.randint(4, vocab, (3, S))
    tgt_in = torch.randint(4, tgt_vocab or vocab, (3, T))
    lens = np.full(3, S), np.full(3, T)
    # The math backend runs attention as matrix products, which the counter sees (it has no
    # formula for the CPU's fused attention kernel).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        logits = model(src, tgt_in)
    assert forward.get_total_flops() == forward_flops(config, tgt_vocab or vocab, *lens)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as step:
        model(src, tgt_in).float().logsumexp(-1).sum().backward()
    assert step.get_total_flops() == train_flops(config, tgt_vocab or vocab, *lens)
    assert logits.shape == (3, T, tgt_vocab or vocab)


def test_rows_of_different_lengths_add_up():
    config = ModelConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2)
    both = forward_flops(config, 30, np.array([4, 9]), np.array([6, 2]))
    apart = forward_flops(config, 30, np.array([4]), np.array([6])) + forward_flops(
        config, 30, np.array([9]), np.array([2])
    )
    assert both == apart


def test_datasheet_peaks_by_device_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H100 PCIe") == pytest.approx(756e12)
    assert peak_flops("NVIDIA L40S") == pytest.approx(362.05e12)
    assert peak_flops("Some CPU") is None
