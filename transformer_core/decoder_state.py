"""The decoder's incremental state: what its layers keep between search steps, so that each step
runs only the new positions. ``transformer_core.model`` reads it (``Transformer.decode(...,
state=...)``) and ``transformer_core.decoding`` builds it (``init_state``), so it lives below both
and knows neither.

Per decoder layer a ``LayerState`` holds the self-attention keys/values of the positions fed so
far and the cross-attention keys/values of the encoder output (computed once); the
``DecoderState`` holds the layers' states, the source padding, and the masks of the current step.
``reorder`` and ``regroup`` move it all with beam search's beams.

Shapes as in ``model.py``; g is the number of rows (beams) sharing one source row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["DecoderState", "LayerState", "causal_mask"]


@dataclass(eq=False)
class LayerState:
    """One decoder layer's cache, and how the current step attends (set by ``DecoderState``).

    The self-attention keys/values live in buffers preallocated along the time axis
    (``capacity`` positions, doubled when exceeded): ``append`` writes new positions in place,
    and ``reorder`` gathers rows into a second pair of buffers kept for that, so no step
    allocates or concatenates a growing cache."""

    self_kv: tuple[Tensor, Tensor]
    """(B, nh, t, hk), (B, nh, t, hv): views of the buffers; t grows with every step."""
    cross_kv: tuple[Tensor, Tensor]
    """(B / g, nh, S, hk), (B / g, nh, S, hv): the encoder output's, one row per g beams."""
    capacity: int = 0
    """Positions to preallocate (a hint; the buffers grow as needed)."""
    plain: bool = False
    """This step attends with plain matmuls and an additive source mask (one position, CPU)."""
    self_mask: Tensor | None = None
    """This step's self-attention mask (new positions x all), None when it allows everything."""
    is_causal: bool = False
    """This step uses SDPA's fused causal mask (the first step: nothing is cached)."""
    _buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    _spare: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        """Positions cached."""
        return self.self_kv[0].size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (B, nh, T, hk), (B, nh, T, hv) after the cached ones, in place;
        returns the views (B, nh, t + T, hk), (B, nh, t + T, hv) of everything so far."""
        past_k, past_v = self.self_kv
        t, T = past_k.size(2), k.size(2)
        buf = self._buffers
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
            self._buffers = buf
        buf[0][:, :, t : t + T].copy_(k)
        buf[1][:, :, t : t + T].copy_(v)
        self.self_kv = (buf[0][:, :, : t + T], buf[1][:, :, : t + T])
        return self.self_kv

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep self-attention rows ``rows`` (B',) and, unless None, cross-attention rows
        ``sources``, in that order."""
        if sources is not None:
            cross_k, cross_v = self.cross_kv
            self.cross_kv = (cross_k.index_select(0, sources), cross_v.index_select(0, sources))
        k, v = self.self_kv
        if self._buffers is None:  # nothing appended yet: a plain gather
            self.self_kv = (k.index_select(0, rows), v.index_select(0, rows))
            return
        n, t, buf, spare = rows.size(0), k.size(2), self._buffers, self._spare
        capacity = buf[0].size(2)
        if spare is None or spare[0].size(0) < n or spare[0].size(2) != capacity:
            spare = (
                buf[0].new_empty(n, buf[0].size(1), capacity, buf[0].size(3)),
                buf[1].new_empty(n, buf[1].size(1), capacity, buf[1].size(3)),
            )
        spare = (spare[0][:n], spare[1][:n])  # leading rows: still contiguous
        torch.index_select(k, 0, rows, out=spare[0][:, :, :t])
        torch.index_select(v, 0, rows, out=spare[1][:, :, :t])
        self._spare, self._buffers = buf, spare
        self.self_kv = (spare[0][:, :, :t], spare[1][:, :, :t])


@dataclass(eq=False)
class DecoderState:
    """Incremental decoding state of all decoder layers. With ``group`` > 1, each row of the
    cross-attention keys/values and of ``src_pad`` serves ``group`` consecutive batch rows (the
    beams of one sentence), so reordering beams within their sentences never copies them."""

    layers: list[LayerState]
    """One per decoder layer."""
    src_pad: Tensor
    """(B / group, S) bool, True at padding."""
    group: int = 1
    """Consecutive batch rows that share one row of cross-attention keys/values and padding."""

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.layers[0].length

    @property
    def batch_size(self) -> int:
        return self.src_pad.size(0) * self.group

    def start_step(self, tgt_in: Tensor, training: bool) -> Tensor:
        """Set each layer's masks for the new decoder input ids (B, T) (their shape checked by
        the model) and return the source mask (B / g, 1, 1, S): additive (0 or -inf) for plain
        attention, else True at real tokens. ``training``: the model's mode."""
        n_past = self.length
        if tgt_in.size(0) != self.batch_size:
            raise ValueError(
                f"tgt_in has batch {tgt_in.size(0)} but the state has {self.batch_size}"
            )
        # One new position on CPU: plain-matmul attention (additive mask), 2x SDPA's speed there.
        plain = tgt_in.device.type == "cpu" and tgt_in.size(1) == 1 and not training
        self_mask = (
            None if plain or n_past == 0 else causal_mask(tgt_in.size(1), n_past, tgt_in.device)
        )
        for layer in self.layers:
            layer.plain, layer.self_mask, layer.is_causal = (
                plain,
                self_mask,
                not plain and n_past == 0,
            )
        pad = self.src_pad[:, None, None, :]  # (B / g, 1, 1, S)
        if not plain:
            return ~pad
        dtype = self.layers[0].cross_kv[0].dtype
        return torch.zeros(pad.shape, dtype=dtype).masked_fill_(pad, float("-inf"))

    def reorder(self, indices: Tensor) -> DecoderState:
        """Keep rows ``indices`` (B',) in that order, in place: beams reorder, finished drop out."""
        if self.group > 1:  # rows may now mix sentences: one cross-attention row per batch row
            sources = torch.div(indices, self.group, rounding_mode="floor")
            self.group = 1
        else:
            sources = indices
        for layer in self.layers:
            layer.reorder(indices, sources)
        self.src_pad = self.src_pad.index_select(0, sources)
        return self

    def regroup(self, rows: Tensor, groups: Tensor | None, group: int) -> DecoderState:
        """Beam search's reorder: keep self-attention rows ``rows`` (B',), keep cross-attention
        rows ``groups`` (all when None), and let each serve ``group`` consecutive rows. The
        caller guarantees that row i of the result belongs to group i // ``group``."""
        n_groups = self.src_pad.size(0) if groups is None else groups.size(0)
        if n_groups * group != rows.size(0):
            raise ValueError(f"{rows.size(0)} rows do not make {n_groups} groups of {group}")
        for layer in self.layers:
            layer.reorder(rows, groups)
        if groups is not None:
            self.src_pad = self.src_pad.index_select(0, groups)
        self.group = group
        return self


def causal_mask(n_new: int, n_past: int, device: torch.device) -> Tensor | None:
    """Boolean (n_new, n_past + n_new) mask: new query i sees keys 0 .. n_past + i. None if the
    mask allows everything (a single new position)."""
    if n_new == 1:
        return None
    return torch.ones(n_new, n_past + n_new, dtype=torch.bool, device=device).tril(diagonal=n_past)
