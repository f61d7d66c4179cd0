"""Our multi-head attention against torch.nn.MultiheadAttention and a naive implementation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from transformer_core import ModelConfig
from transformer_core.model import MultiHeadAttention

D, H = 32, 4


def _pair(seed: int = 0) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """Our attention and torch's, holding the same weights."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(ModelConfig(d_model=D, n_heads=H, d_ff=64)).eval()
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        for proj in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
            nn.init.normal_(proj.weight, std=0.2)
            nn.init.normal_(proj.bias, std=0.2)
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def _naive(x, mem, attn: MultiHeadAttention, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) V per head, written out with explicit loops over heads."""
    q, k, v = attn.q_proj(x), attn.k_proj(mem), attn.v_proj(mem)
    heads = []
    for h in range(attn.n_heads):
        qh = q[..., h * attn.d_k : (h + 1) * attn.d_k]
        kh = k[..., h * attn.d_k : (h + 1) * attn.d_k]
        vh = v[..., h * attn.d_v : (h + 1) * attn.d_v]
        logits = qh @ kh.transpose(-1, -2) / math.sqrt(attn.d_k)
        logits = logits.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(logits, dim=-1) @ vh)
    return attn.out_proj(torch.cat(heads, dim=-1))


def test_self_attention_with_padding_matches_torch():
    ours, ref = _pair()
    x = torch.randn(3, 7, D)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 6:] = True
    k, v = ours.keys_values(x)
    got = ours(x, k, v, mask=~pad[:, None, None, :])
    want, _ = ref(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cross_attention_with_padding_matches_torch():
    ours, ref = _pair(seed=1)
    x, mem = torch.randn(2, 5, D), torch.randn(2, 9, D)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, 3:] = True
    k, v = ours.keys_values(mem)
    got = ours(x, k, v, mask=~pad[:, None, None, :])
    want, _ = ref(x, mem, mem, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_causal_attention_matches_torch():
    ours, ref = _pair(seed=2)
    x = torch.randn(2, 6, D)
    k, v = ours.keys_values(x)
    got = ours(x, k, v, is_causal=True)
    # torch's convention for attn_mask: True = blocked.
    future = torch.ones(6, 6, dtype=torch.bool).triu(diagonal=1)
    want, _ = ref(x, x, x, attn_mask=future, need_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padding_changes_the_output_when_not_masked():
    # Guards the tests above: the mask must matter for them to mean anything.
    ours, _ = _pair()
    x = torch.randn(1, 7, D)
    k, v = ours.keys_values(x)
    allowed = torch.ones(1, 1, 1, 7, dtype=torch.bool)
    allowed[..., 4:] = False
    assert not torch.allclose(ours(x, k, v, mask=allowed), ours(x, k, v), atol=1e-3)


@pytest.mark.parametrize("d_k,d_v", [(16, 8), (4, 24)])
def test_distinct_key_and_value_widths_match_naive(d_k, d_v):
    torch.manual_seed(3)
    config = ModelConfig(d_model=D, n_heads=H, d_ff=64, d_k=d_k, d_v=d_v)
    attn = MultiHeadAttention(config).eval()
    assert attn.q_proj.weight.shape == (H * d_k, D)
    assert attn.v_proj.weight.shape == (H * d_v, D)
    assert attn.out_proj.weight.shape == (D, H * d_v)
    x, mem = torch.randn(2, 4, D), torch.randn(2, 6, D)
    allowed = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    allowed[1, ..., 2:] = False
    k, v = attn.keys_values(mem)
    got = attn(x, k, v, mask=allowed)
    want = _naive(x, mem, attn, allowed[:, 0])  # (B, 1, S) for per-head (B, T, S) logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_beams_sharing_keys_and_values_equal_a_copy_per_beam():
    # Beam search's layout: g consecutive query rows (a sentence's beams) share one row of keys,
    # values and mask; the plain-matmul path (additive mask) computes the same.
    ours, _ = _pair(seed=5)
    x, mem = torch.randn(6, 2, D), torch.randn(3, 5, D)  # 3 sentences x 2 beams, 2 queries each
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    pad[2, 1:] = True
    k, v = ours.keys_values(mem)  # (3, nh, 5, hk)
    mask = ~pad[:, None, None, :]
    beams = torch.arange(3).repeat_interleave(2)
    with torch.no_grad():
        shared = ours(x, k, v, mask=mask)
        copied = ours(x, k[beams], v[beams], mask=mask[beams])
        additive = torch.zeros(3, 1, 1, 5).masked_fill(pad[:, None, None, :], float("-inf"))
        plain = ours(x, k, v, mask=additive, plain=True)
    torch.testing.assert_close(shared, copied, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain, copied, atol=1e-5, rtol=1e-5)
