"""The full model: norm order, padding, tied embeddings, positions, init, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_models import V, tiny_model, tiny_tokens

from evaluation.attention import cross_attention_maps
from transformer_core import BOS_ID, PAD_ID, Transformer, count_parameters, presets
from transformer_core.config_checks import ConfigError
from transformer_core.model import sinusoids

# -- padding ---------------------------------------------------------------------------------


def test_padding_does_not_change_real_positions():
    model = tiny_model(seed=6)
    src_a, tgt_a = tiny_tokens(1, 5, seed=7), tiny_tokens(1, 4, seed=8, first=BOS_ID)
    src_b, tgt_b = tiny_tokens(1, 9, seed=9), tiny_tokens(1, 7, seed=10, first=BOS_ID)
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
    model = tiny_model()
    assert model.src_embed.weight is model.tgt_embed.weight
    assert model.tgt_embed.weight is model.generator.weight
    unshared = tiny_model(share_embeddings=False)
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
        model.check_values(src=torch.full((1, 3), 40))  # valid target id, not a valid source id
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
    model = tiny_model(dropout=0.0)
    tokens = tiny_tokens(2, 5)
    D = model.config.d_model
    want = model.src_embed.weight[tokens] * math.sqrt(D) + sinusoids(64, D)[:5]
    torch.testing.assert_close(model.embed(tokens, model.src_embed), want)
    torch.testing.assert_close(
        model.embed(tokens, model.src_embed, start=3)[:, 0],
        model.src_embed.weight[tokens[:, 0]] * math.sqrt(D) + sinusoids(64, D)[3],
    )


def test_learned_positions_are_parameters():
    sinus, learned = tiny_model(), tiny_model(positional="learned")
    config = learned.config
    assert count_parameters(learned) - count_parameters(sinus) == config.max_len * config.d_model
    assert "pos_table" not in sinus.state_dict()  # recomputed, not stored


# -- initialisation, dropout, state dict -----------------------------------------------------


def test_initialisation_is_pytorchs_transformer_layers():
    # Each weight's range and spread against torch.nn.TransformerEncoderLayer's own init
    # (packed q/k/v Xavier, default Linear elsewhere); attention biases zero, FFN biases not.
    model = tiny_model()
    D, h, d_ff = model.config.d_model, model.config.n_heads, model.config.d_ff
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(D, h, d_ff, batch_first=True)
    ours = model.encoder_layers[0]
    q, k, v = ref.self_attn.in_proj_weight.detach().chunk(3)
    pairs = [
        (ours.self_attn.q_proj.weight, q),
        (ours.self_attn.k_proj.weight, k),
        (ours.self_attn.v_proj.weight, v),
        (ours.self_attn.out_proj.weight, ref.self_attn.out_proj.weight),
        (ours.ffn.w1.weight, ref.linear1.weight),
        (ours.ffn.w2.weight, ref.linear2.weight),
        (ours.ffn.w1.bias, ref.linear1.bias),
    ]
    for mine, theirs in pairs:
        assert mine.abs().max().item() == pytest.approx(theirs.abs().max().item(), rel=0.05)
        assert mine.std().item() == pytest.approx(theirs.std().item(), rel=0.15)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert getattr(ours.self_attn, proj).bias.abs().max() == 0
    assert model.src_embed.weight.std().item() == pytest.approx(D**-0.5, rel=0.1)


def test_fairseq_initialisation_matches_fairseq_09s_formulas():
    # fairseq 0.9 (modules/multihead_attention.py reset_parameters, transformer_layer.py Linear):
    # U(+-gain sqrt(6 / (fan_in + fan_out))); q/k/v gain 1/sqrt(2) with nn.Linear's default
    # biases U(+-1/sqrt(fan_in)); out_proj, fc1, fc2 gain 1 with zero biases; pad row zero.
    model = tiny_model(d_ff=96, init="fairseq")
    D, d_ff, pad = model.config.d_model, model.config.d_ff, model.config.pad_id
    for layer in (*model.encoder_layers, *model.decoder_layers):
        attentions = [layer.self_attn] + (
            [layer.cross_attn] if hasattr(layer, "cross_attn") else []
        )
        expected = [(layer.ffn.w1, 1.0, D, d_ff), (layer.ffn.w2, 1.0, d_ff, D)]
        for attn in attentions:
            expected += [(p, 2**-0.5, D, D) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
            expected.append((attn.out_proj, 1.0, D, D))
            for p in (attn.q_proj, attn.k_proj, attn.v_proj):
                assert 0 < p.bias.abs().max().item() <= D**-0.5
        for linear, gain, fan_in, fan_out in expected:
            bound = gain * (6 / (fan_in + fan_out)) ** 0.5
            assert linear.weight.abs().max().item() == pytest.approx(bound, rel=0.05)
            assert linear.weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.15)
        for linear in (layer.ffn.w1, layer.ffn.w2, *(a.out_proj for a in attentions)):
            assert linear.bias.abs().max() == 0
    assert model.src_embed.weight[pad].abs().max() == 0
    assert model.src_embed.weight[pad + 1 :].std().item() == pytest.approx(D**-0.5, rel=0.1)
    with pytest.raises(ConfigError, match="init: 'xavier' is not one of 'torch', 'fairseq'"):
        model.config.replace(init="xavier")


def test_dropout_only_in_training():
    model = tiny_model()
    src, tgt = tiny_tokens(2, 6), tiny_tokens(2, 5, first=BOS_ID)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(src, tgt))
        model.train()
        assert not torch.allclose(model(src, tgt), model(src, tgt))


def test_state_dict_round_trip_keeps_ties():
    model = tiny_model(seed=1)
    fresh = tiny_model(seed=2)
    fresh.load_state_dict(model.state_dict())
    assert fresh.src_embed.weight is fresh.generator.weight
    src, tgt = tiny_tokens(2, 6), tiny_tokens(2, 5, first=BOS_ID)
    with torch.no_grad():
        torch.testing.assert_close(fresh(src, tgt), model(src, tgt))


# -- bad input --------------------------------------------------------------------------------


SHAPE_ERRORS = [
    (torch.zeros(0, 5, dtype=torch.long), "empty"),
    (torch.zeros(2, 0, dtype=torch.long), "empty"),
    (torch.full((1, 65), 5), "longer than config.max_len"),
    (torch.ones(4, dtype=torch.long), "batch, length"),
    (torch.ones(1, 4), "integer"),
]
VALUE_ERRORS = [
    (torch.full((1, 4), V), "token ids"),
    (torch.full((1, 4), -1), "token ids"),
    (torch.tensor([[5, 6], [PAD_ID, PAD_ID]]), "only of padding"),
]


@pytest.mark.parametrize("src,message", SHAPE_ERRORS + VALUE_ERRORS)
def test_bad_source_fails_clearly(src, message):
    # check_values is what search runs first: shapes, then the values it reads back to the host.
    with pytest.raises(ValueError, match=message):
        tiny_model().check_values(src=src)


@pytest.mark.parametrize("src,message", SHAPE_ERRORS)
def test_encode_checks_shapes_itself(src, message):
    with pytest.raises(ValueError, match=message):
        tiny_model().encode(src)


def test_bad_decoder_input_fails_clearly():
    model = tiny_model()
    memory = model.encode(tiny_tokens(2, 5))
    with pytest.raises(ValueError, match="empty"):
        model.decode(torch.zeros(2, 0, dtype=torch.long), memory)
    with pytest.raises(ValueError, match="batch"):
        model.decode(tiny_tokens(3, 2), memory)
    with pytest.raises(ValueError, match="tgt_in has token ids"):
        model.check_values(tgt_in=torch.full((2, 3), V))


def test_bad_vocabulary_size_fails_clearly():
    with pytest.raises(ValueError, match="vocab_size"):
        Transformer(presets.debug(), 3)


def test_cross_attention_maps_are_the_weights_the_model_applies():
    model = tiny_model(seed=9).train()
    src = tiny_tokens(2, 6, seed=10)
    src[1, 4:] = PAD_ID
    tgt = tiny_tokens(2, 5, seed=11, first=BOS_ID)
    maps = cross_attention_maps(model, src, tgt)
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
    post, pre = tiny_model(seed=12), tiny_model(seed=12, norm_first=True)
    assert not hasattr(post, "encoder_norm")
    extra = 2 * 2 * pre.config.d_model  # two final LayerNorms, weight and bias
    assert count_parameters(pre) == count_parameters(post) + extra
    # The same weights, placed differently, compute something else.
    pre.load_state_dict(post.state_dict(), strict=False)
    src, tgt = tiny_tokens(2, 5), tiny_tokens(2, 4, first=BOS_ID)
    with torch.no_grad():
        assert not torch.allclose(pre(src, tgt), post(src, tgt), atol=1e-3)
        # Pre-norm: the encoder output is the final norm of the residual stream.
        memory = pre.encode(src).states
    torch.testing.assert_close(memory.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)


# -- norm order -------------------------------------------------------------------------------


def _randomize_norms(module: torch.nn.Module) -> None:
    # Identity LayerNorm affines would hide a norm applied in the wrong place.
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.5)
                m.bias.normal_(0.0, 0.5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_norm_order_is_one_rule_in_encoder_and_decoder_layers(norm_first):
    # Post-norm: x <- LayerNorm(x + f(x)); pre-norm: x <- x + f(LayerNorm(x)); dropout off.
    model = tiny_model(seed=13, norm_first=norm_first, dropout=0.0)
    _randomize_norms(model)
    enc, dec = model.encoder_layers[0], model.decoder_layers[0]
    x, memory = torch.randn(2, 5, model.config.d_model), torch.randn(2, 6, model.config.d_model)
    src_mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    src_mask[1, ..., 4:] = False

    def residual(norm, x, f):
        return x + f(norm(x)) if norm_first else norm(x + f(x))

    def self_attn(attn, mask=None, causal=False):
        return lambda h: attn(h, *attn.keys_values(h), mask=mask, is_causal=causal)

    def cross_attn(h):
        return dec.cross_attn(h, *dec.cross_attn.keys_values(memory), mask=src_mask)

    with torch.no_grad():
        want = residual(enc.norm1, memory, self_attn(enc.self_attn, mask=src_mask))
        want = residual(enc.norm2, want, enc.ffn)
        torch.testing.assert_close(enc(memory, src_mask), want)
        want = residual(dec.norm1, x, self_attn(dec.self_attn, causal=True))
        want = residual(dec.norm2, want, cross_attn)
        want = residual(dec.norm3, want, dec.ffn)
        torch.testing.assert_close(dec(x, memory, src_mask), want)
        # The other order computes something else, so the comparison above can fail.
        other = enc.norm2(x + enc.ffn(x)) if norm_first else x + enc.ffn(enc.norm2(x))
        assert not torch.allclose(enc.sublayer(enc.norm2, x, enc.ffn), other, atol=1e-3)


def test_parameter_names_are_the_checkpoint_format():
    names = set(tiny_model(norm_first=True).state_dict())
    layer = {
        f"{stack}_layers.0.{name}.{p}"
        for stack, subs in (
            ("encoder", ("self_attn.q_proj", "norm1", "ffn.w1", "norm2")),
            ("decoder", ("self_attn.k_proj", "norm1", "cross_attn.out_proj", "norm2", "norm3")),
        )
        for name in subs
        for p in ("weight", "bias")
    }
    ends = {"src_embed.weight", "tgt_embed.weight", "generator.weight", "decoder_norm.bias"}
    assert layer | ends <= names


def test_a_shallow_decoder_has_its_own_layer_count():
    """``decoder_layers`` sets the decoder's depth alone (a distillation student's shape); left
    out, both stacks have ``n_layers``, as in the paper."""
    config = presets.debug().replace(n_layers=3, decoder_layers=1)
    model = Transformer(config, 40)
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 1)
    assert len(Transformer(presets.debug(), 40).decoder_layers) == presets.debug().n_layers
    with pytest.raises(ConfigError, match="decoder_layers"):
        presets.debug().replace(decoder_layers=0)


def test_attention_under_cpu_bf16_autocast_runs_in_float32(monkeypatch):
    """Under CPU bf16 autocast (``train.precision: bf16``) the projections run in bf16 but SDPA gets
    float32 queries, keys and values (its bf16 backward is slow on CPUs); the output is bf16."""
    import transformer_core.model as model_module

    seen: list[torch.dtype] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.extend({q.dtype, k.dtype, v.dtype})
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    model = tiny_model(seed=3)
    src, tgt = tiny_tokens(2, 6, seed=4), tiny_tokens(2, 5, seed=5, first=BOS_ID)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    assert logits.dtype == torch.bfloat16
    assert seen and set(seen) == {torch.float32}
    with torch.no_grad():
        expected = model(src, tgt)
    torch.testing.assert_close(logits.float(), expected, atol=0.1, rtol=0.05)
