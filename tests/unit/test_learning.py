"""The debug model learns a toy task on CPU: reverse a short sequence of symbols."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_core import BOS_ID, EOS_ID, PAD_ID, Transformer, presets
from transformer_core.schedule import make_optimizer, make_scheduler
from transformer_core.search import SearchSettings, search

VOCAB = 12  # 4 special ids + 8 symbols
FIRST_SYMBOL = 4


def reverse_task(n: int, seed: int, min_len: int = 3, max_len: int = 8):
    """(src, tgt_in, target) for n random sequences; the target is the source reversed.
    Sources and targets end with EOS, as the shards store them; batches are right-padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    src = torch.full((n, max_len + 1), PAD_ID)
    target = torch.full((n, max_len + 1), PAD_ID)
    for i, length in enumerate(lengths.tolist()):
        words = torch.randint(FIRST_SYMBOL, VOCAB, (length,), generator=g)
        src[i, :length], src[i, length] = words, EOS_ID
        target[i, :length], target[i, length] = words.flip(0), EOS_ID
    tgt_in = torch.cat([torch.full((n, 1), BOS_ID), target[:, :-1]], dim=1)
    tgt_in = tgt_in.masked_fill(tgt_in.eq(EOS_ID), PAD_ID)  # EOS is never a decoder input
    return src, tgt_in, target


def train(steps: int, batch: int = 64, seed: int = 0) -> tuple[Transformer, list[float]]:
    torch.manual_seed(seed)
    model = Transformer(presets.debug().replace(dropout=0.0, max_len=32), VOCAB)
    # The paper's optimizer and schedule: warmup to 3.1e-3 at step 100 (d_model 64, scale 0.25).
    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer, d_model=64, warmup_steps=100, scale=0.25)
    losses = []
    for step in range(steps):
        src, tgt_in, target = reverse_task(batch, seed=1000 + step)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(
            logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=PAD_ID, label_smoothing=0.1
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return model, losses


def exact_match(model: Transformer, settings: SearchSettings, n: int = 200) -> float:
    src, _, target = reverse_task(n, seed=7)  # seed 7 is never a training batch
    outputs = [hyps[0].tokens for hyps in search(model, src, settings)]
    wanted = [row[: row.tolist().index(EOS_ID)].tolist() for row in target]
    return sum(o == w for o, w in zip(outputs, wanted, strict=True)) / n


@pytest.mark.slow  # a few hundred training steps until the model reverses: ~18 s
def test_debug_model_learns_to_reverse():
    # About 5-10 s on a loaded 2-core CPU, so it runs always.
    model, losses = train(steps=400)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.35 * first, f"loss {first:.2f} -> {last:.2f}"  # the floor is ~0.5 (smoothing)
    assert exact_match(model, SearchSettings(beam_size=1, greedy=True, max_len_offset=2)) >= 0.95
    assert exact_match(model, SearchSettings(beam_size=4, max_len_offset=2)) >= 0.95
