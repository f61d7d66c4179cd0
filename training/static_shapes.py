"""Static shapes for CUDA graphs: every micro-batch padded up to one of a few bucketed shapes,
and for each shape the forward and backward (model and loss) captured once, then replayed.

A small model's update on a GPU is bound by the host launching its kernels one at a time (the
published Multi30k recipe's model: ~900 top-level operations a forward and backward, 41 ms an
update on an H100 where the arithmetic takes a few); a CUDA graph launches them all at once.
Graphs need fixed shapes and no host syncs, hence the buckets. The rows and columns added are
padding to the loss and never seen by a real position, so the gradient is the unpadded batch's.
Written on ``torch.cuda.make_graphed_callables`` rather than torch.compile's reduce-overhead
mode: capturing a shape takes milliseconds, where inductor compiles each one for tens of seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from transformer_core.model import Transformer

STEPS_PER_OCTAVE = 8
"""Bucket sizes between n and 2n: at most 1/8 (12.5%) padding added to a side."""
MIN_STEP = 8
"""The finest bucket step (rows, source and target lengths are multiples of 8)."""

Contexts = Callable[[], contextlib.AbstractContextManager[Any]]
Loss = Callable[..., tuple[Tensor, Tensor, Tensor]]


def bucket(n: int, limit: int | None = None) -> int:
    """The smallest bucket size >= ``n``: a multiple of ``MIN_STEP``, with ``STEPS_PER_OCTAVE``
    sizes per doubling above that (so 8, 16, ..., 64, 72, 80, ..., 128, 144, ...); at most
    ``limit`` (the model's positions), which is then returned as is."""
    n = max(int(n), 1)
    # n in [2^k, 2^(k+1)): steps of 2^k / STEPS_PER_OCTAVE, and never finer than MIN_STEP
    step = max(MIN_STEP, (1 << (n.bit_length() - 1)) // STEPS_PER_OCTAVE)
    size = -(-n // step) * step
    return size if limit is None else min(size, max(limit, n))


def bucket_shape(src: Tensor, tgt: Tensor, max_len: int) -> tuple[int, int, int]:
    """``(B, S, T)`` of the bucket that a batch of ``src (B, S)`` and ``tgt (B, T)`` pads to."""
    return bucket(src.size(0)), bucket(src.size(1), max_len), bucket(tgt.size(1), max_len)


def pad_to_bucket(
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    *,
    max_len: int,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """A collated batch padded to its bucket shape. Columns added are padding; rows added have a
    source of one EOS (a row of padding alone would give its attention nothing to attend to, and
    NaN in the backward) and targets of padding, so they add nothing to the loss."""
    B, S, T = bucket_shape(src, tgt_in, max_len)
    if (B, S, T) == (src.size(0), src.size(1), tgt_in.size(1)):
        return src, tgt_in, tgt_out
    out_src = src.new_full((B, S), pad_id)
    out_src[src.size(0) :, 0] = eos_id
    out_src[: src.size(0), : src.size(1)] = src
    out_in = tgt_in.new_full((B, T), pad_id)
    out_in[tgt_in.size(0) :, 0] = bos_id
    out_in[: tgt_in.size(0), : tgt_in.size(1)] = tgt_in
    out_out = tgt_out.new_full((B, T), pad_id)
    out_out[: tgt_out.size(0), : tgt_out.size(1)] = tgt_out
    return out_src, out_in, out_out


class _LossOf(nn.Module):
    """The model and its loss as one module: what a graph captures (make_graphed_callables needs
    a module to see the parameters, and replaces its ``forward``, so one instance per shape)."""

    def __init__(
        self, model: Transformer, loss: Loss, epsilon: float, pad_id: int, contexts: Contexts
    ):
        super().__init__()
        self.model = model
        self._loss, self._epsilon, self._pad_id, self._contexts = loss, epsilon, pad_id, contexts

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        with self._contexts():
            logits = self.model(src, tgt_in)  # (B, T, V)
        loss, nll, n = self._loss(
            logits, target=tgt_out, epsilon=self._epsilon, pad_id=self._pad_id
        )
        return loss, nll.detach(), n  # only the loss is differentiated


class StaticShapeLoss:
    """The summed loss, NLL and target count of a bucket-shaped micro-batch, differentiable: on
    CUDA a graph per shape, captured on first sight (``shapes``, ``capture_seconds``) into one
    memory pool and replayed after; on a CPU the eager call, the same arithmetic.

    One pool serves every shape, which is safe while each graph's outputs are used before the
    next replay: one micro-batch per update (``Trainer`` checks it), gradients consumed by the
    optimizer before the next step."""

    def __init__(self, module: Transformer, loss: Loss, contexts: Contexts):
        mc = module.config
        self._make = lambda: _LossOf(module, loss, mc.label_smoothing, mc.pad_id, contexts)
        self._eager = self._make()
        self._cuda = next(module.parameters()).device.type == "cuda"
        self._graphs: dict[tuple[int, ...], Callable[..., Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self._cuda else None
        self.capture_seconds = 0.0

    @property
    def shapes(self) -> int:
        """Shapes captured so far (0 on a CPU)."""
        return len(self._graphs)

    def __call__(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        if not self._cuda:
            return self._eager(src, tgt_in, tgt_out)
        key = (*src.shape, *tgt_in.shape)
        if key not in self._graphs:
            started = time.time()
            sample = tuple(t.clone() for t in (src, tgt_in, tgt_out))  # the graph's own inputs
            self._graphs[key] = torch.cuda.make_graphed_callables(
                self._make(), sample, pool=self._pool
            )
            self.capture_seconds += time.time() - started
        return self._graphs[key](src, tgt_in, tgt_out)
