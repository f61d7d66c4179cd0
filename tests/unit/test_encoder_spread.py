"""The encoder-collapse diagnostic logged with every validation."""

from __future__ import annotations

import torch

from training.validation import encoder_spread
from transformer_core import PAD_ID, Transformer, presets


def test_spread_is_large_for_a_reading_encoder_and_zero_for_a_collapsed_one():
    torch.manual_seed(0)
    model = Transformer(presets.debug(), 50).eval()
    src = torch.randint(4, 50, (3, 9))
    src[2, 5:] = PAD_ID
    with torch.no_grad():
        healthy = float(encoder_spread(model.encode(src)))
        # A last layer norm with zero gain outputs its bias at every position: what a collapsed
        # encoder looks like from the decoder's side.
        last = model.encoder_layers[-1].norm2
        last.weight.zero_()
        last.bias.normal_()
        collapsed = float(encoder_spread(model.encode(src)))
    assert healthy > 0.2  # ~0.46 at initialisation
    assert collapsed < 1e-5


def test_padding_does_not_count():
    torch.manual_seed(1)
    model = Transformer(presets.debug(), 50).eval()
    src = torch.randint(4, 50, (1, 6))
    padded = torch.cat([src, torch.full((1, 4), PAD_ID)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(
            encoder_spread(model.encode(src)), encoder_spread(model.encode(padded))
        )
