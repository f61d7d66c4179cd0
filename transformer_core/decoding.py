"""Incremental decoding: the model's decoder layers fed a few new positions at a time, over a
cache of the keys/values of the positions before them (what search runs at every step).

``init_state`` caches every layer's cross-attention keys/values of the encoder output;
``decode_step`` runs new positions through the same sub-layer blocks as ``Transformer.decode``
(so the same norms and residuals), attending over the cache; ``DecoderState.reorder`` and
``regroup`` move the cache with beam search's beams. The CPU fast paths live here too.

    state = init_state(model, model.encode(src), capacity=max_steps)
    logits = decode_step(model, tgt_in[:, -1:], state)  # (B, 1, V)
    state.reorder(best_rows)

Shapes as in ``model.py``; g is the number of rows (beams) sharing one source row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_core.model import Memory, MultiHeadAttention, Transformer

LOGIT_CHUNK = 2048
"""Vocabulary rows per block of the chunked output projection (see ``chunked_logits``)."""


@dataclass
class DecoderState:
    """Incremental decoding cache: per layer, self-attention keys/values of the positions fed so
    far, and cross-attention keys/values of the encoder output (computed once).

    The self-attention keys/values live in per-layer buffers preallocated along the time axis
    (``capacity`` positions, doubled when exceeded): each ``decode_step`` writes its new
    positions in place, and ``reorder`` gathers the rows into a second buffer kept for that,
    so no step allocates or concatenates a growing cache. With ``group`` > 1, each row of
    ``cross_kv`` and ``src_pad`` serves ``group`` consecutive batch rows (the beams of one
    sentence), so reordering beams within their sentences never copies them."""

    self_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B, nh, t, hk), (B, nh, t, hv); t grows with every ``decode_step``."""
    cross_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B / group, nh, S, hk), (B / group, nh, S, hv)."""
    src_pad: Tensor
    """(B / group, S) bool, True at padding."""
    group: int = 1
    """Consecutive batch rows that share one row of ``cross_kv`` and ``src_pad``."""
    capacity: int = 0
    """Positions to preallocate in the self-attention buffers (a hint; they grow as needed)."""
    _buffers: list[tuple[Tensor, Tensor] | None] = field(init=False, repr=False)
    _spare: list[tuple[Tensor, Tensor] | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Per layer: the buffers the cached keys/values are views of, and a second pair that
        # reordering gathers into (then the two swap); None until a layer's first append.
        self._buffers = [None] * len(self.self_kv)
        self._spare = [None] * len(self.self_kv)

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.self_kv[0][0].size(2)

    @property
    def batch_size(self) -> int:
        return self.src_pad.size(0) * self.group

    def _buffer(self, layer: int, past: Tensor) -> tuple[Tensor, Tensor] | None:
        """Layer ``layer``'s buffers if ``past`` (its cached keys) is a view of them."""
        buf = self._buffers[layer]
        if buf is None or buf[0].data_ptr() != past.data_ptr() or buf[0].size(0) != past.size(0):
            return None
        return buf

    def _append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (B, nh, T, hk) of ``layer`` after the cached ones, in place;
        returns the views (B, nh, t + T, hk), (B, nh, t + T, hv) of everything so far."""
        past_k, past_v = self.self_kv[layer]
        t, T = past_k.size(2), k.size(2)
        buf = self._buffer(layer, past_k)
        if buf is None or buf[0].size(2) < t + T or buf[0].dtype != k.dtype:
            capacity = max(t + T, self.capacity, 2 * t, 8)
            B, nh = k.size(0), k.size(1)
            buf = (
                k.new_empty(B, nh, capacity, k.size(3)),  # (B, nh, capacity, hk)
                v.new_empty(B, nh, capacity, v.size(3)),  # (B, nh, capacity, hv)
            )
            if t:
                buf[0][:, :, :t].copy_(past_k)
                buf[1][:, :, :t].copy_(past_v)
            self._buffers[layer] = buf
        buf[0][:, :, t : t + T].copy_(k)
        buf[1][:, :, t : t + T].copy_(v)
        kv = (buf[0][:, :, : t + T], buf[1][:, :, : t + T])
        self.self_kv[layer] = kv
        return kv

    def _pick_self(self, indices: Tensor) -> None:
        """Keep rows ``indices`` of the self-attention cache, gathered into the spare buffers."""
        n = indices.size(0)
        for layer, (k, v) in enumerate(self.self_kv):
            buf = self._buffer(layer, k)
            t = k.size(2)
            if buf is None:  # not (yet) in a buffer: a plain gather
                self.self_kv[layer] = (k.index_select(0, indices), v.index_select(0, indices))
                continue
            spare = self._spare[layer]
            capacity = buf[0].size(2)
            if spare is None or spare[0].size(0) < n or spare[0].size(2) != capacity:
                spare = (
                    buf[0].new_empty(n, buf[0].size(1), capacity, buf[0].size(3)),
                    buf[1].new_empty(n, buf[1].size(1), capacity, buf[1].size(3)),
                )
            spare = (spare[0][:n], spare[1][:n])  # leading rows: still contiguous
            torch.index_select(k, 0, indices, out=spare[0][:, :, :t])
            torch.index_select(v, 0, indices, out=spare[1][:, :, :t])
            self._spare[layer], self._buffers[layer] = buf, spare
            self.self_kv[layer] = (spare[0][:, :, :t], spare[1][:, :, :t])

    def _pick_cross(self, indices: Tensor) -> None:
        self.cross_kv = [
            (k.index_select(0, indices), v.index_select(0, indices)) for k, v in self.cross_kv
        ]
        self.src_pad = self.src_pad.index_select(0, indices)

    def reorder(self, indices: Tensor) -> DecoderState:
        """Keep rows ``indices`` (B',) in that order, in place: beams reorder, finished drop out."""
        if self.group > 1:  # rows may now mix sentences: one cross-attention row per batch row
            self._pick_cross(torch.div(indices, self.group, rounding_mode="floor"))
            self.group = 1
        else:
            self._pick_cross(indices)
        self._pick_self(indices)
        return self

    def regroup(self, rows: Tensor, groups: Tensor | None, group: int) -> DecoderState:
        """Beam search's reorder: keep self-attention rows ``rows`` (B',), keep cross-attention
        rows ``groups`` (all when None), and let each serve ``group`` consecutive rows. The
        caller guarantees that row i of the result belongs to group i // ``group``."""
        n_groups = self.src_pad.size(0) if groups is None else groups.size(0)
        if n_groups * group != rows.size(0):
            raise ValueError(f"{rows.size(0)} rows do not make {n_groups} groups of {group}")
        self._pick_self(rows)
        if groups is not None:
            self._pick_cross(groups)
        self.group = group
        return self


def init_state(model: Transformer, memory: Memory, capacity: int = 0) -> DecoderState:
    """An empty cache for decoding against ``memory``, holding its cross-attention keys/values;
    ``capacity`` (optional) preallocates that many target positions."""
    config = model.config
    B = memory.states.size(0)
    empty_k = memory.states.new_zeros(B, config.n_heads, 0, config.head_dim_k)  # (B, nh, 0, hk)
    empty_v = memory.states.new_zeros(B, config.n_heads, 0, config.head_dim_v)  # (B, nh, 0, hv)
    return DecoderState(
        self_kv=[(empty_k, empty_v) for _ in model.decoder_layers],
        cross_kv=[layer.cross_attn.keys_values(memory.states) for layer in model.decoder_layers],
        src_pad=memory.src_pad,
        capacity=min(capacity, config.max_len),
    )


def decode_step(model: Transformer, tgt_in: Tensor, state: DecoderState) -> Tensor:
    """Logits (B, T, V) of the new decoder input ids ``tgt_in`` (B, T), which follow the
    ``state.length`` cached positions; appends their keys/values to ``state``."""
    n_past = state.length
    model.check_shape(tgt_in, "tgt_in", start=n_past)
    if tgt_in.size(0) != state.batch_size:
        raise ValueError(f"tgt_in has batch {tgt_in.size(0)} but the state has {state.batch_size}")
    cpu = tgt_in.device.type == "cpu"
    # One new position on CPU: plain-matmul attention (additive mask), 2x SDPA's speed there.
    small = cpu and tgt_in.size(1) == 1 and not model.training
    pad = state.src_pad[:, None, None, :]  # (B / g, 1, 1, S)
    if small:
        dtype = state.cross_kv[0][0].dtype
        src_mask = torch.zeros(pad.shape, dtype=dtype).masked_fill_(pad, float("-inf"))
    else:
        src_mask = ~pad  # True at real source tokens
    x = model.embed(tgt_in, model.tgt_embed, start=n_past)  # (B, T, D)
    for i, layer in enumerate(model.decoder_layers):
        self_attend = partial(_self_attention, layer.self_attn, state=state, layer=i, small=small)
        cross_attend = partial(
            _cross_attention,
            layer.cross_attn,
            kv=state.cross_kv[i],
            mask=src_mask,
            group=state.group,
            small=small,
        )
        x = layer.self_attn_block(x, self_attend)
        x = layer.cross_attn_block(x, cross_attend)
        x = layer.ffn_block(x)
    if model.config.norm_first:
        x = model.decoder_norm(x)
    # On CPU without autograd the output projection runs in vocabulary chunks: 1.3x at 37k.
    if cpu and not torch.is_grad_enabled() and _plain_linear(model.generator, x):
        return chunked_logits(model.generator, x)  # (B, T, V)
    return model.generator(x)  # (B, T, V)


def causal_mask(n_new: int, n_past: int, device: torch.device) -> Tensor | None:
    """Boolean (n_new, n_past + n_new) mask: new query i sees keys 0 .. n_past + i. None if the
    mask allows everything (a single new position)."""
    if n_new == 1:
        return None
    return torch.ones(n_new, n_past + n_new, dtype=torch.bool, device=device).tril(diagonal=n_past)


def _self_attention(
    attn: MultiHeadAttention, h: Tensor, state: DecoderState, layer: int, small: bool
) -> Tensor:
    """Queries h (B, T, D) of the new positions over the cached and their own keys/values,
    which are appended to layer ``layer``'s cache."""
    n_past = state.self_kv[layer][0].size(2)  # this layer's length before the append
    k, v = state._append(layer, *attn.keys_values(h))  # (B, nh, n_past + T, hk): buffer views
    if small:  # one new position sees every cached one: no mask
        return grouped_attention(attn, h, k, v, None, group=1, additive=True)
    if n_past == 0:
        return attn(h, k, v, is_causal=True)  # SDPA's fused causal path
    return attn(h, k, v, mask=causal_mask(h.size(1), n_past, h.device))


def _cross_attention(
    attn: MultiHeadAttention,
    h: Tensor,
    kv: tuple[Tensor, Tensor],
    mask: Tensor,
    group: int,
    small: bool,
) -> Tensor:
    """Queries h (B, T, D) over the encoder output's cached keys/values (B / group rows)."""
    if group == 1 and not small:
        return attn(h, *kv, mask=mask)
    return grouped_attention(attn, h, *kv, mask, group=group, additive=small)


def grouped_attention(
    attn: MultiHeadAttention,
    x: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    group: int,
    additive: bool = False,
) -> Tensor:
    """``attn(x, k, v, mask)`` for x (n*g, T, D) whose g consecutive rows share the keys/values
    k (n, nh, S, hk), v and mask (n, 1, 1, S): the g*T queries of a group attend together (the
    beams of one sentence over its source), so k and v are never copied per row. With
    ``additive``, ``mask`` is 0 or -inf and the attention runs as plain matmuls (no dropout)."""
    B, T, _ = x.shape
    n = B // group
    q = attn.q_proj(x).view(n, group * T, attn.n_heads, attn.d_k)  # (n, g*T, nh, hk)
    q = q.transpose(1, 2)  # (n, nh, g*T, hk)
    if additive:
        y = _matmul_attention(q, k, v, mask)  # (n, nh, g*T, hv)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (n, nh, g*T, hv)
    y = y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.d_v)  # (n*g, T, nh*hv)
    return attn.out_proj(y)  # (n*g, T, D)


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(d_k) + bias) v with plain matmuls: for a few queries on CPU about
    twice as fast as SDPA's kernel."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.size(-1)))  # (.., Tq, S)
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _plain_linear(generator: nn.Module, x: Tensor) -> bool:
    """Whether ``chunked_logits`` computes what ``generator(x)`` does: a float nn.Linear (not,
    say, quantized) of x's dtype, outside autocast."""
    return (
        type(generator) is nn.Linear
        and x.dtype == generator.weight.dtype
        and not torch.is_autocast_enabled(x.device.type)
    )


def chunked_logits(generator: nn.Linear, x: Tensor, chunk: int = LOGIT_CHUNK) -> Tensor:
    """``generator(x)`` (B, T, D) -> (B, T, V) in vocabulary chunks of ``chunk`` rows written
    into one output: the same dot products (each logit is one full-width product, so bitwise
    the same values), split so that both threads of a small CPU stay busy and each weight slice
    is read once per call (1.3x faster than one (B*T, D) x (D, V) GEMM on 2 threads at
    V = 37,000). Without autograd, which ``out=`` does not support."""
    weight = generator.weight  # (V, D)
    rows = x.reshape(-1, x.size(-1))  # (B*T, D)
    V = weight.size(0)
    out = rows.new_empty(rows.size(0), V)  # (B*T, V)
    for start in range(0, V, chunk):
        part = weight[start : start + chunk]  # (c, D), contiguous rows
        torch.mm(rows, part.t(), out=out[:, start : start + part.size(0)])
    return out.view(*x.shape[:-1], V)  # (B, T, V)
