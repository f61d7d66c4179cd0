"""``benchmarks/gpu.py``'s decoding row: beam search of base with EOS masked (fixed-length
outputs), float32 and bfloat16 weights."""

from __future__ import annotations

import torch
from gpu_training import VOCAB

from transformer_core import presets


def decoding(batches: tuple[int, ...], out_len: int) -> list[dict]:
    from common import best_tokens
    from decode import NoEOS, sources, timed  # masks EOS in decode_step (fixed-length outputs)

    rows = []
    torch.manual_seed(0)
    model = NoEOS(presets.get("base"), VOCAB).cuda().eval()
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for batch in batches:
            src = sources(batch, 25, VOCAB, seed=batch).cuda()
            best_tokens(model, src, beam_size=4, max_len=4)  # this batch's shapes, warmed up
            seconds, out = timed(best_tokens, model, src, beam_size=4, max_len=out_len)
            assert all(len(o) == out_len for o in out)
            rows.append(
                {
                    "model": "base",
                    "dtype": str(dtype).removeprefix("torch."),
                    "beam": 4,
                    "batch": batch,
                    "out_len": out_len,
                    "tgt_tokens/s": batch * out_len / seconds,
                }
            )
    return rows
