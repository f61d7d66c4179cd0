"""The full model: incremental decoding, padding, tied embeddings, positions, init, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_core import BOS_ID, PAD_ID, Transformer, count_parameters, presets
from transformer_core.model import sinusoids

V = 40


def _model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    config = presets.debug().replace(max_len=64, **changes)
    return Transformer(config, V).eval()


def _tokens(B: int, T: int, seed: int = 1, first: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (B, T), generator=g)
    if first is not None:
        x[:, 0] = first
    return x


# -- incremental decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_full_forward(norm_first):
    model = _model(norm_first=norm_first)
    src = _tokens(3, 9)
    src[1, 6:] = PAD_ID
    tgt = _tokens(3, 8, seed=2, first=BOS_ID)
    with torch.no_grad():
        full = model(src, tgt)
        memory = model.encode(src)
        state = model.init_state(memory)
        steps = [model.decode(tgt[:, :3], memory, state)]  # a chunk first, then one at a time
        steps += [model.decode(tgt[:, t : t + 1], memory, state) for t in range(3, 8)]
    assert state.length == 8
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_after_reorder_equals_full_forward(norm_first):
    model = _model(seed=3, norm_first=norm_first)
    src = _tokens(3, 7, seed=4)
    src[2, 3:] = PAD_ID
    tgt = _tokens(3, 6, seed=5, first=BOS_ID)
    order = torch.tensor([2, 0, 0, 1])  # permute, duplicate and (implicitly) grow the batch
    with torch.no_grad():
        memory = model.encode(src)
        state = model.init_state(memory)
        model.decode(tgt[:, :3], memory, state)
        state.reorder(order)
        tail = torch.cat(
            [model.decode(tgt[order, t : t + 1], memory, state) for t in range(3, 6)], 1
        )
        full = model(src[order], tgt[order])
    torch.testing.assert_close(tail, full[:, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_grouped_state_equals_full_forward(norm_first):
    # Beam search's layout: one row per sentence for the first step, then k beams per sentence
    # sharing its cross-attention keys/values; a sentence drops out; then a plain reorder.
    model = _model(seed=6, norm_first=norm_first)
    src = _tokens(3, 7, seed=7)
    src[1, 4:] = PAD_ID
    src[2, 2:] = PAD_ID
    tgt = _tokens(6, 7, seed=8, first=BOS_ID)  # (3 sentences x 2 beams, T), each beam its own
    beams = torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.inference_mode():
        memory = model.encode(src)
        state = model.init_state(memory, capacity=3)  # smaller than needed: the buffers grow
        model.decode(tgt[::2, :1], memory, state)  # (3, 1, V)
        state.regroup(beams, None, 2)
        head = torch.cat([model.decode(tgt[:, t : t + 1], memory, state) for t in (1, 2)], 1)
        rows = torch.tensor([1, 0, 4, 5])  # sentence 1 ends; beams swap within sentence 0
        state.regroup(rows, torch.tensor([0, 2]), 2)
        tgt2 = tgt[rows]
        mid = torch.cat([model.decode(tgt2[:, t : t + 1], memory, state) for t in (3, 4)], 1)
        order = torch.tensor([3, 0])  # beams of different sentences side by side: group 1
        state.reorder(order)
        tgt3 = tgt2[order]
        tail = torch.cat([model.decode(tgt3[:, t : t + 1], memory, state) for t in (5, 6)], 1)
        full = model(src[beams], tgt)
        full2 = model(src[beams][rows], tgt2)
        full3 = model(src[beams][rows][order], tgt3)
    assert state.group == 1 and state.length == 7
    torch.testing.assert_close(head, full[:, 1:3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mid, full2[:, 3:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail, full3[:, 5:7], atol=1e-5, rtol=1e-5)


def test_regroup_rejects_rows_that_do_not_fill_the_groups():
    model = _model()
    with torch.no_grad():
        state = model.init_state(model.encode(_tokens(2, 5)))
        with pytest.raises(ValueError, match="groups of 2"):
            state.regroup(torch.tensor([0, 0, 1]), None, 2)


def test_chunked_output_projection_equals_the_linear_layer():
    model = _model()
    model._LOGIT_CHUNK = 7  # V = 40: five full chunks and a short one
    x = torch.randn(2, 3, model.config.d_model)
    with torch.inference_mode():
        chunked = model._logits(x)
    torch.testing.assert_close(chunked, model.generator(x), atol=1e-6, rtol=1e-6)


def test_state_continues_positions_from_cached_length():
    # Feeding the same token at two steps must give different outputs: positions advance.
    model = _model()
    src = _tokens(1, 5)
    with torch.no_grad():
        memory = model.encode(src)
        state = model.init_state(memory)
        a = model.decode(torch.tensor([[BOS_ID]]), memory, state)
        b = model.decode(torch.tensor([[BOS_ID]]), memory, state)
    assert not torch.allclose(a, b, atol=1e-4)


# -- padding ---------------------------------------------------------------------------------


def test_padding_does_not_change_real_positions():
    model = _model(seed=6)
    src_a, tgt_a = _tokens(1, 5, seed=7), _tokens(1, 4, seed=8, first=BOS_ID)
    src_b, tgt_b = _tokens(1, 9, seed=9), _tokens(1, 7, seed=10, first=BOS_ID)
    src = torch.full((2, 9), PAD_ID)
    src[0, :5], src[1] = src_a[0], src_b[0]
    tgt = torch.full((2, 7), PAD_ID)
    tgt[0, :4], tgt[1] = tgt_a[0], tgt_b[0]
    with torch.no_grad():
        alone_states = model.encode(src_a).states
        alone_logits = model(src_a, tgt_a)
        memory = model.encode(src)
        batch_logits = model(src, tgt)
    assert memory.src_pad[0].tolist() == [False] * 5 + [True] * 4
    torch.testing.assert_close(memory.states[0, :5], alone_states[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch_logits[0, :4], alone_logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        batch_logits[1], model(src_b, tgt_b)[0].detach(), atol=1e-5, rtol=1e-5
    )


# -- embeddings and positions --------------------------------------------------------------


def test_three_embedding_roles_are_one_tensor():
    model = _model()
    assert model.src_embed.weight is model.tgt_embed.weight
    assert model.tgt_embed.weight is model.generator.weight
    unshared = _model(share_embeddings=False)
    D = model.config.d_model
    assert count_parameters(model) == count_parameters(unshared) - 2 * V * D


def test_separate_vocabularies_have_distinct_embeddings_and_work():
    torch.manual_seed(0)
    model = Transformer(presets.debug(), vocab_size=30, tgt_vocab_size=50).eval()
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.src_embed.weight.shape[0] == 30 and model.tgt_embed.weight.shape[0] == 50
    assert model.generator.weight is model.tgt_embed.weight  # decoder side stays tied
    src = torch.randint(4, 30, (2, 6))
    tgt = torch.randint(4, 50, (2, 5))
    assert model(src, tgt).shape == (2, 5, 50)
    with pytest.raises(ValueError, match="src has token ids"):
        model.encode(torch.full((1, 3), 40))  # valid target id, not a valid source id
    untied = Transformer(presets.debug().replace(share_embeddings=False), 30, 50)
    assert untied.generator.weight is not untied.tgt_embed.weight


def test_sinusoids_match_the_formula():
    d = 16
    table = sinusoids(100, d)
    for pos in (0, 1, 7, 99):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_embedding_is_scaled_and_adds_sinusoids():
    model = _model(dropout=0.0)
    tokens = _tokens(2, 5)
    D = model.config.d_model
    want = model.src_embed.weight[tokens] * math.sqrt(D) + sinusoids(64, D)[:5]
    torch.testing.assert_close(model._embed(tokens, model.src_embed), want)
    torch.testing.assert_close(
        model._embed(tokens, model.src_embed, start=3)[:, 0],
        model.src_embed.weight[tokens[:, 0]] * math.sqrt(D) + sinusoids(64, D)[3],
    )


def test_learned_positions_are_parameters():
    sinus, learned = _model(), _model(positional="learned")
    config = learned.config
    assert count_parameters(learned) - count_parameters(sinus) == config.max_len * config.d_model
    assert "pos_table" not in sinus.state_dict()  # recomputed, not stored


# -- initialisation, dropout, state dict -----------------------------------------------------


def test_initialisation():
    model = _model()
    D = model.config.d_model
    w = model.encoder_layers[0].ffn.w1.weight
    bound = math.sqrt(6 / (w.shape[0] + w.shape[1]))  # xavier-uniform
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert model.encoder_layers[0].ffn.w1.bias.abs().max() == 0
    assert model.src_embed.weight.std().item() == pytest.approx(D**-0.5, rel=0.1)


def test_dropout_only_in_training():
    model = _model()
    src, tgt = _tokens(2, 6), _tokens(2, 5, first=BOS_ID)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(src, tgt))
        model.train()
        assert not torch.allclose(model(src, tgt), model(src, tgt))


def test_state_dict_round_trip_keeps_ties():
    model = _model(seed=1)
    fresh = _model(seed=2)
    fresh.load_state_dict(model.state_dict())
    assert fresh.src_embed.weight is fresh.generator.weight
    src, tgt = _tokens(2, 6), _tokens(2, 5, first=BOS_ID)
    with torch.no_grad():
        torch.testing.assert_close(fresh(src, tgt), model(src, tgt))


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,message",
    [
        (torch.zeros(0, 5, dtype=torch.long), "empty"),
        (torch.zeros(2, 0, dtype=torch.long), "empty"),
        (torch.full((1, 65), 5), "longer than config.max_len"),
        (torch.full((1, 4), V), "token ids"),
        (torch.full((1, 4), -1), "token ids"),
        (torch.tensor([[5, 6], [PAD_ID, PAD_ID]]), "only of padding"),
        (torch.ones(4, dtype=torch.long), "batch, length"),
        (torch.ones(1, 4), "integer"),
    ],
)
def test_bad_source_fails_clearly(src, message):
    with pytest.raises(ValueError, match=message):
        _model().encode(src)


def test_bad_decoder_input_fails_clearly():
    model = _model()
    memory = model.encode(_tokens(2, 5))
    with pytest.raises(ValueError, match="empty"):
        model.decode(torch.zeros(2, 0, dtype=torch.long), memory)
    with pytest.raises(ValueError, match="batch"):
        model.decode(_tokens(3, 2), memory)
    state = model.init_state(memory)
    model.decode(_tokens(2, 60), memory, state)
    with pytest.raises(ValueError, match="reaches length 65"):  # cached 60 + 5 new > max_len 64
        model.decode(_tokens(2, 5), memory, state)


def test_bad_vocabulary_size_fails_clearly():
    with pytest.raises(ValueError, match="vocab_size"):
        Transformer(presets.debug(), 3)


def test_cross_attention_maps_are_the_weights_the_model_applies():
    model = _model(seed=9).train()
    src = _tokens(2, 6, seed=10)
    src[1, 4:] = PAD_ID
    tgt = _tokens(2, 5, seed=11, first=BOS_ID)
    maps = model.cross_attention(src, tgt)
    assert model.training  # the mode is restored
    assert len(maps) == model.config.n_layers
    for w in maps:
        assert w.shape == (2, model.config.n_heads, 5, 6)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, model.config.n_heads, 5))
        assert torch.all(w[1, :, :, 4:] == 0)  # padding gets no attention
    # The weights reproduce the layer's output: softmax(q k^T / sqrt(d_k)) v, then out_proj.
    attn = model.decoder_layers[0].cross_attn
    with torch.no_grad():
        x = torch.randn(2, 5, model.config.d_model)
        k, v = attn.keys_values(torch.randn(2, 6, model.config.d_model))
        mask = ~src.eq(PAD_ID)[:, None, None, :]
        w = attn.eval().weights(x, k, mask)
        y = (w @ v).transpose(1, 2).reshape(2, 5, -1)
        torch.testing.assert_close(attn.out_proj(y), attn(x, k, v, mask=mask), atol=1e-5, rtol=1e-5)


def test_pre_norm_places_the_norms_before_each_sublayer_and_at_the_ends():
    post, pre = _model(seed=12), _model(seed=12, norm_first=True)
    assert not hasattr(post, "encoder_norm")
    extra = 2 * 2 * pre.config.d_model  # two final LayerNorms, weight and bias
    assert count_parameters(pre) == count_parameters(post) + extra
    # The same weights, placed differently, compute something else.
    pre.load_state_dict(post.state_dict(), strict=False)
    src, tgt = _tokens(2, 5), _tokens(2, 4, first=BOS_ID)
    with torch.no_grad():
        assert not torch.allclose(pre(src, tgt), post(src, tgt), atol=1e-3)
        # Pre-norm: the encoder output is the final norm of the residual stream.
        memory = pre.encode(src).states
    torch.testing.assert_close(memory.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
