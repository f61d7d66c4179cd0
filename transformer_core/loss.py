"""The training objective: label-smoothed cross-entropy over non-padding tokens (paper 5.4).

Variant (fairseq's original ``label_smoothed_nll_loss``, also Szegedy et al. 2016): the target
distribution puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over all
``V`` classes, the reference included, so the reference gets ``1 - eps + eps / V``::

    loss = (1 - eps) * nll + (eps / V) * sum_v(-log p_v)

This is exactly the cross-entropy against that smoothed one-hot distribution. (Newer fairseq and
tensor2tensor spread ``eps`` over the ``V - 1`` other classes instead; the two differ by
``O(eps / V)``.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _check(x: Tensor, name: str, last: str, target: Tensor, epsilon: float) -> None:
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon {epsilon!r} must be in [0, 1)")
    if x.shape[:-1] != target.shape:
        raise ValueError(
            f"{name} {tuple(x.shape)} and target {tuple(target.shape)} disagree: "
            f"expected {name} (..., {last}) with target (...)"
        )


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed plain NLL (for perplexity) and the non-pad token count.

    ``logits`` is ``(B, T, V)`` or ``(N, V)``; ``target`` is ``(B, T)`` or ``(N,)``. Positions
    where ``target == pad_id`` are ignored. The log-softmax runs in float32 whatever the logits'
    dtype (bf16 logits lose too much precision in the normaliser). Returns float32 scalars and a
    0-d int64 count, all tensors so that they can be all-reduced without a host sync.
    """
    _check(logits, "logits", "V", target, epsilon)
    vocab = logits.size(-1)
    lprobs = torch.log_softmax(logits.float().reshape(-1, vocab), dim=-1)  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != pad_id  # (N,)
    # Pad targets index a valid row anyway; they are masked out below.
    nll = -lprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (N,)
    smooth = -lprobs.sum(dim=-1)  # (N,)
    nll = nll.masked_fill(~keep, 0.0)
    smooth = smooth.masked_fill(~keep, 0.0)
    nll_sum = nll.sum()
    loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * smooth.sum()
    return loss_sum, nll_sum, keep.sum()


# Rows of hidden states per chunk of the fused loss: about 2**27 logits (256 MiB in bf16) a chunk.
CHUNK_LOGITS = 1 << 27
CPU_CHUNK_LOGITS = 1 << 22
"""A CPU's chunk: 16 MiB of float32 logits, near its caches (a CPU has no launches to save)."""


def chunk_loss_and_grad(
    logits: Tensor, target: Tensor, keep: Tensor, epsilon: float
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk's summed loss and NLL, and d(summed loss)/d(logits) in the logits' dtype.

    The loss of a row is ``lse - (1 - eps) x_t - (eps / V) sum_v x_v``, so its gradient is
    ``softmax(x) - (1 - eps) onehot(t) - eps / V``; pad rows get zero. One pass in float32.
    """
    vocab = logits.size(-1)
    x = logits.float()  # (C, V)
    lse = torch.logsumexp(x, dim=-1)  # (C,)
    target_logit = x.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (C,)
    nll = (lse - target_logit) * keep
    smooth = (vocab * lse - x.sum(dim=-1)) * keep
    loss = (1.0 - epsilon) * nll + (epsilon / vocab) * smooth
    grad = torch.exp(x - lse.unsqueeze(-1)) - epsilon / vocab
    grad = grad.scatter_add(
        -1, target.unsqueeze(-1), torch.full_like(target_logit, epsilon - 1.0).unsqueeze(-1)
    )
    grad = grad * keep.unsqueeze(-1)
    return loss.sum(), nll.sum(), grad.to(logits.dtype)


class _LinearLabelSmoothedNll(torch.autograd.Function):
    """The pre-softmax projection and the loss in chunks of rows, gradients computed on the way
    (as Liger-Kernel's fused linear cross-entropy does): the (N, V) logits, their float32
    log-softmax and its gradient never exist whole. Hand-written because torch has no fused
    linear + label-smoothed loss; checked against ``label_smoothed_nll`` in tests/unit/test_loss.py.
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, epsilon, pad_id, chunk_fn, compute_dtype, chunk):
        n, vocab = hidden.size(0), weight.size(0)
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        keep = target != pad_id
        target = target.clamp(min=0)  # pad rows index a valid column; keep zeroes them
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        nll = torch.zeros((), dtype=torch.float32, device=hidden.device)
        rows = max(1, (chunk or CHUNK_LOGITS) // vocab)
        for start in range(0, n, rows):
            h_c = h[start : start + rows]  # (C, D)
            logits = h_c @ w.t()  # (C, V)
            loss_c, nll_c, grad = chunk_fn(
                logits, target[start : start + rows], keep[start : start + rows], epsilon
            )
            loss += loss_c
            nll += nll_c
            torch.mm(grad, w, out=grad_h[start : start + rows])
            grad_w += (grad.t() @ h_c).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        count = keep.sum()
        ctx.mark_non_differentiable(nll, count)
        return loss, nll, count

    @staticmethod
    def backward(ctx, *grads):
        grad_loss = grads[0]  # nll and the count are not differentiable: their grads are unused
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (
            (grad_h * grad_loss).to(h_dtype),
            (grad_w * grad_loss).to(w_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def linear_label_smoothed_nll(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    pad_id: int,
    chunk_fn: Callable[..., tuple[Tensor, Tensor, Tensor]] = chunk_loss_and_grad,
    dtype: torch.dtype | None = None,
    chunk_logits: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll(hidden @ weight.T, target, ...)`` without the whole logits tensor.

    ``hidden`` is ``(..., D)`` (the decoder's last states), ``weight`` the ``(V, D)`` pre-softmax
    projection, ``target`` ``(...)``. The projection runs in autocast's dtype when autocast is on
    (bf16 on GPUs) or in ``dtype`` if given (for a caller outside the autocast region), else in
    the inputs' dtype; the softmax runs in float32; gradients flow to ``hidden`` and ``weight`` only
    through the summed loss (the NLL is a metric). ``chunk_fn`` may be a compiled
    ``chunk_loss_and_grad``, which fuses each chunk's softmax and gradient into one kernel.
    ``chunk_logits``: logits a chunk (``CHUNK_LOGITS`` if None).
    """
    _check(hidden, "hidden", "D", target, epsilon)
    device = hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    if dtype is not None:
        compute_dtype = dtype
    else:
        compute_dtype = torch.get_autocast_dtype(device) if autocast else hidden.dtype
    with torch.autocast(device, enabled=False):
        return _LinearLabelSmoothedNll.apply(
            hidden.reshape(-1, hidden.size(-1)),
            weight,
            target.reshape(-1),
            epsilon,
            pad_id,
            chunk_fn,
            compute_dtype,
            chunk_logits,
        )
