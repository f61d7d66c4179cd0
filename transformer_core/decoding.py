"""Incremental decoding: each search step runs only the new positions
(``Transformer.decode(tgt_in, None, state=state)``) against the decoder's cached state
(``transformer_core.decoder_state``: ``DecoderState``, built here by ``init_state``).
``decode_step`` adds the CPU fast path of the output projection; ``RecomputeState`` is the
uncached reference for tests.

    state = init_state(model, model.encode(src), capacity=max_steps)
    logits = decode_step(model, tgt_in[:, -1:], state)  # (B, 1, V)
    state.reorder(best_rows)

Shapes as in ``model.py``.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from transformer_core.decoder_state import DecoderState, LayerState, causal_mask
from transformer_core.model import DecoderLayer, Memory, Transformer

__all__ = [
    "LOGIT_CHUNK",
    "DecoderState",
    "IncrementalState",
    "LayerState",
    "RecomputeState",
    "causal_mask",
    "chunked_logits",
    "decode_step",
    "init_state",
]

LOGIT_CHUNK = 2048
"""Vocabulary rows per block of the chunked output projection (see ``chunked_logits``)."""


class IncrementalState(Protocol):
    """What a search steps through (``decode_step``): the cache, ``DecoderState``, or the
    uncached reference, ``RecomputeState``."""

    @property
    def length(self) -> int:
        """Target positions decoded so far."""
        ...

    def reorder(self, indices: Tensor) -> IncrementalState:
        """Keep rows ``indices`` (B',) in that order, in place."""
        ...

    def regroup(self, rows: Tensor, groups: Tensor | None, group: int) -> IncrementalState:
        """Beam search's reorder: rows ``rows`` (B',), each ``group`` of them on one source."""
        ...


def init_state(model: Transformer, memory: Memory, capacity: int = 0) -> DecoderState:
    """An empty cache for decoding against ``memory``, holding its cross-attention keys/values;
    ``capacity`` (optional) preallocates that many target positions."""
    config = model.config
    B = memory.states.size(0)
    empty_k = memory.states.new_zeros(B, config.n_heads, 0, config.head_dim_k)  # (B, nh, 0, hk)
    empty_v = memory.states.new_zeros(B, config.n_heads, 0, config.head_dim_v)  # (B, nh, 0, hv)
    capacity = min(capacity, config.max_len)
    layers = []
    for layer in model.decoder_layers:
        assert isinstance(layer, DecoderLayer)  # nn.ModuleList types its items as any Module
        cross_kv = layer.cross_attn.keys_values(memory.states)
        layers.append(LayerState((empty_k, empty_v), cross_kv, capacity))
    return DecoderState(layers, memory.src_pad)


def decode_step(model: Transformer, tgt_in: Tensor, state: IncrementalState) -> Tensor:
    """Logits (B, T, V) of the new decoder input ids ``tgt_in`` (B, T), which follow the
    ``state.length`` cached positions; appends their keys/values to ``state``."""
    if isinstance(state, RecomputeState):
        return state.decode(model, tgt_in)
    if not isinstance(state, DecoderState):
        raise TypeError(f"decode_step needs a DecoderState or a RecomputeState, not {type(state)}")
    x = model.decode(tgt_in, None, project=False, state=state)  # (B, T, D)
    # On CPU without autograd the output projection runs in vocabulary chunks: 1.3x at 37k.
    if x.device.type == "cpu" and not torch.is_grad_enabled() and _plain_linear(model.generator, x):
        return chunked_logits(model.generator, x)  # (B, T, V)
    return model.generator(x)  # (B, T, V)


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


class RecomputeState:
    """The reference without a cache, for tests and benchmarks: each step reruns
    ``Transformer.decode`` over the whole prefix. The same interface as ``DecoderState``."""

    def __init__(self, memory: Memory):
        self.memory = memory
        self.tokens = memory.src_pad.new_zeros(memory.src_pad.size(0), 0, dtype=torch.long)

    @property
    def length(self) -> int:
        return self.tokens.size(1)

    def decode(self, model: Transformer, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V) of the new positions ``tgt_in`` (B, T), from the full pass."""
        self.tokens = torch.cat([self.tokens, tgt_in], dim=1)  # (B, t + T)
        return model.decode(self.tokens, self.memory)[:, -tgt_in.size(1) :]

    def reorder(self, indices: Tensor) -> RecomputeState:
        states, src_pad = self.memory.states, self.memory.src_pad
        self.memory = Memory(states.index_select(0, indices), src_pad.index_select(0, indices))
        self.tokens = self.tokens.index_select(0, indices)
        return self

    def regroup(self, rows: Tensor, groups: Tensor | None, group: int) -> RecomputeState:
        """``reorder(rows)``: every row keeps its own copy of the source."""
        return self.reorder(rows)
