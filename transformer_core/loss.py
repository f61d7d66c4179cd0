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

import torch
from torch import Tensor


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed plain NLL (for perplexity) and the non-pad token count.

    ``logits`` is ``(B, T, V)`` or ``(N, V)``; ``target`` is ``(B, T)`` or ``(N,)``. Positions
    where ``target == pad_id`` are ignored. The log-softmax runs in float32 whatever the logits'
    dtype (bf16 logits lose too much precision in the normaliser). Returns float32 scalars and a
    0-d int64 count, all tensors so that they can be all-reduced without a host sync.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon {epsilon!r} must be in [0, 1)")
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree: "
            "expected logits (..., V) with target (...)"
        )
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
