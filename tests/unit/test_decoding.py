"""Incremental decoding against the full forward pass: cache, reorder, beam groups, fast paths."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import tiny_model, tiny_tokens

from transformer_core import BOS_ID, PAD_ID
from transformer_core.decoding import (
    LayerState,
    RecomputeState,
    causal_mask,
    chunked_logits,
    decode_step,
    init_state,
)


@pytest.mark.parametrize(
    "changes",
    [{"norm_first": False}, {"norm_first": True}, {"n_layers": 3, "decoder_layers": 1}],
    ids=["post-norm", "pre-norm", "shallow-decoder"],
)
def test_incremental_decoding_equals_full_forward(changes):
    model = tiny_model(**changes)
    src = tiny_tokens(3, 9)
    src[1, 6:] = PAD_ID
    tgt = tiny_tokens(3, 8, seed=2, first=BOS_ID)
    with torch.no_grad():
        full = model(src, tgt)
        state = init_state(model, model.encode(src))
        steps = [decode_step(model, tgt[:, :3], state)]  # a chunk first, then one at a time
        steps += [decode_step(model, tgt[:, t : t + 1], state) for t in range(3, 8)]
    assert state.length == 8
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_after_reorder_equals_full_forward(norm_first):
    model = tiny_model(seed=3, norm_first=norm_first)
    src = tiny_tokens(3, 7, seed=4)
    src[2, 3:] = PAD_ID
    tgt = tiny_tokens(3, 6, seed=5, first=BOS_ID)
    order = torch.tensor([2, 0, 0, 1])  # permute, duplicate and (implicitly) grow the batch
    with torch.no_grad():
        state = init_state(model, model.encode(src))
        decode_step(model, tgt[:, :3], state)
        state.reorder(order)
        tail = torch.cat([decode_step(model, tgt[order, t : t + 1], state) for t in range(3, 6)], 1)
        full = model(src[order], tgt[order])
    torch.testing.assert_close(tail, full[:, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_grouped_state_equals_full_forward(norm_first):
    # Beam search's layout: one row per sentence for the first step, then k beams per sentence
    # sharing its cross-attention keys/values; a sentence drops out; then a plain reorder.
    model = tiny_model(seed=6, norm_first=norm_first)
    src = tiny_tokens(3, 7, seed=7)
    src[1, 4:] = PAD_ID
    src[2, 2:] = PAD_ID
    tgt = tiny_tokens(6, 7, seed=8, first=BOS_ID)  # (3 sentences x 2 beams, T), each beam its own
    beams = torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.inference_mode():
        state = init_state(model, model.encode(src), capacity=3)  # too small: the buffers grow
        decode_step(model, tgt[::2, :1], state)  # (3, 1, V)
        state.regroup(beams, None, 2)
        head = torch.cat([decode_step(model, tgt[:, t : t + 1], state) for t in (1, 2)], 1)
        rows = torch.tensor([1, 0, 4, 5])  # sentence 1 ends; beams swap within sentence 0
        state.regroup(rows, torch.tensor([0, 2]), 2)
        tgt2 = tgt[rows]
        mid = torch.cat([decode_step(model, tgt2[:, t : t + 1], state) for t in (3, 4)], 1)
        order = torch.tensor([3, 0])  # beams of different sentences side by side: group 1
        state.reorder(order)
        tgt3 = tgt2[order]
        tail = torch.cat([decode_step(model, tgt3[:, t : t + 1], state) for t in (5, 6)], 1)
        full = model(src[beams], tgt)
        full2 = model(src[beams][rows], tgt2)
        full3 = model(src[beams][rows][order], tgt3)
    assert state.group == 1 and state.length == 7
    torch.testing.assert_close(head, full[:, 1:3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mid, full2[:, 3:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail, full3[:, 5:7], atol=1e-5, rtol=1e-5)


def test_grouped_chunks_without_the_cpu_fast_path_equal_full_forward():
    # Steps of two positions take the paths an accelerator takes for every step: boolean masks,
    # SDPA with a causal mask over the cache, grouped SDPA cross-attention for the beams.
    model = tiny_model(seed=9)
    src = tiny_tokens(2, 6, seed=10)
    src[1, 3:] = PAD_ID
    tgt = tiny_tokens(4, 5, seed=11, first=BOS_ID)  # 2 sentences x 2 beams
    with torch.inference_mode():
        state = init_state(model, model.encode(src))
        decode_step(model, tgt[::2, :1], state)  # BOS, the same for both beams
        state.regroup(torch.tensor([0, 0, 1, 1]), None, 2)
        tail = torch.cat([decode_step(model, tgt[:, t : t + 2], state) for t in (1, 3)], 1)
        full = model(src[torch.tensor([0, 0, 1, 1])], tgt)
    assert state.group == 2
    torch.testing.assert_close(tail, full[:, 1:], atol=1e-5, rtol=1e-5)


def test_regroup_rejects_rows_that_do_not_fill_the_groups():
    model = tiny_model()
    with torch.no_grad():
        state = init_state(model, model.encode(tiny_tokens(2, 5)))
        with pytest.raises(ValueError, match="groups of 2"):
            state.regroup(torch.tensor([0, 0, 1]), None, 2)


def test_chunked_output_projection_equals_the_linear_layer():
    model = tiny_model()
    x = torch.randn(2, 3, model.config.d_model)
    with torch.inference_mode():
        chunked = chunked_logits(model.generator, x, chunk=7)  # V = 40: 5 full chunks, 1 short
    torch.testing.assert_close(chunked, model.generator(x), atol=1e-6, rtol=1e-6)


def test_state_continues_positions_from_cached_length():
    # Feeding the same token at two steps must give different outputs: positions advance.
    model = tiny_model()
    with torch.no_grad():
        state = init_state(model, model.encode(tiny_tokens(1, 5)))
        a = decode_step(model, torch.tensor([[BOS_ID]]), state)
        b = decode_step(model, torch.tensor([[BOS_ID]]), state)
    assert not torch.allclose(a, b, atol=1e-4)


def test_bad_step_input_fails_clearly():
    model = tiny_model()
    with torch.no_grad():
        state = init_state(model, model.encode(tiny_tokens(2, 5)))
        with pytest.raises(ValueError, match="batch"):
            decode_step(model, tiny_tokens(3, 1), state)
        decode_step(model, tiny_tokens(2, 60), state)
        with pytest.raises(ValueError, match="reaches length 65"):  # cached 60 + 5 new > max_len 64
            decode_step(model, tiny_tokens(2, 5), state)


def test_causal_mask_with_past_is_the_tail_of_the_full_mask():
    full = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(causal_mask(3, 4, torch.device("cpu")), full[4:, :])
    assert causal_mask(1, 5, torch.device("cpu")) is None  # one new position sees everything


def test_layer_state_reorder_gathers_the_cached_rows():
    # Rows 0..2 hold distinct keys/values; reorder permutes, duplicates and drops them, in and
    # out of the preallocated buffers, and the cross-attention rows follow their own indices.
    keys = torch.arange(3 * 2 * 4 * 5, dtype=torch.float32).view(3, 2, 4, 5)  # (B, nh, T, hk)
    cross = (torch.randn(3, 2, 6, 5), torch.randn(3, 2, 6, 5))
    layer = LayerState((keys[:, :, :0], keys[:, :, :0]), cross, capacity=2)
    layer.reorder(torch.tensor([2, 0, 1]))  # before any append: a plain gather of nothing
    assert layer.length == 0 and layer.self_kv[0].shape == (3, 2, 0, 5)
    k, v = layer.append(keys[:, :, :3], -keys[:, :, :3])
    assert layer.length == 3
    torch.testing.assert_close(k, keys[:, :, :3], rtol=0, atol=0)
    order = torch.tensor([2, 0, 0, 1])
    layer.reorder(order, sources=torch.tensor([1, 1, 0, 2]))
    torch.testing.assert_close(layer.self_kv[0], keys[order, :, :3], rtol=0, atol=0)
    torch.testing.assert_close(layer.self_kv[1], -keys[order, :, :3], rtol=0, atol=0)
    torch.testing.assert_close(layer.cross_kv[0], cross[0][torch.tensor([1, 1, 0, 2])])
    k, _ = layer.append(keys[order, :, 3:], -keys[order, :, 3:])  # written after the gathered
    torch.testing.assert_close(k, keys[order], rtol=0, atol=0)
    layer.reorder(torch.tensor([3]))  # drop rows
    torch.testing.assert_close(layer.self_kv[0], keys[torch.tensor([1])], rtol=0, atol=0)


@pytest.mark.parametrize("chunk", [1, 2])
def test_cached_steps_equal_the_uncached_reference_through_regroups(chunk):
    # The reference (RecomputeState) reruns the full forward pass each step; the cache must
    # give the same logits through beam search's layout changes.
    model = tiny_model(seed=14)
    src = tiny_tokens(2, 6, seed=15)
    src[1, 3:] = PAD_ID
    tgt = tiny_tokens(4, 7, seed=16, first=BOS_ID)  # 2 sentences x 2 beams
    with torch.inference_mode():
        memory = model.encode(src)
        cached, reference = init_state(model, memory), RecomputeState(memory)
        outs = {id(s): [] for s in (cached, reference)}
        for state in (cached, reference):
            outs[id(state)].append(decode_step(model, tgt[::2, :1], state))
            state.regroup(torch.tensor([0, 0, 1, 1]), None, 2)
            for t in range(1, 5, chunk):
                outs[id(state)].append(decode_step(model, tgt[:, t : t + chunk], state))
            state.regroup(torch.tensor([1, 0]), torch.tensor([0]), 2)  # sentence 1 ends
            outs[id(state)].append(decode_step(model, tgt[torch.tensor([1, 0]), 5:7], state))
    assert cached.length == reference.length == 7
    for a, b in zip(outs[id(cached)], outs[id(reference)], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_model_decode_with_a_state_is_the_incremental_pass():
    # Transformer.decode itself takes the state: decode_step only adds the chunked projection.
    model = tiny_model(seed=17)
    src, tgt = tiny_tokens(2, 5, seed=18), tiny_tokens(2, 4, seed=19, first=BOS_ID)
    with torch.inference_mode():
        full = model.decode(tgt, model.encode(src))
        state = init_state(model, model.encode(src))
        steps = [model.decode(tgt[:, t : t + 1], None, state=state) for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
