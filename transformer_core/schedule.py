"""The optimiser and learning-rate schedule of paper section 5.3.

``lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``: linear warmup to a peak at
``step == warmup_steps``, then decay with the inverse square root of the step. Steps count
optimizer updates from 1; step 0 is an error (the formula is infinite there), and
``lr_lambda`` maps LambdaLR's 0-based counter onto it so that the first update uses step 1.

``linear`` keeps the warmup and its peak, then decays linearly to zero at ``total_steps`` (the
last update at 1 / (total - warmup + 1) of the peak): for a run whose length is fixed in
advance, where decaying to zero does within the run what averaging the last checkpoints does
after it (docs/log/multi30k-laptop.md measures it against the paper's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import torch
from torch import nn

from transformer_core.config import Decay

DECAYS: tuple[Decay, ...] = get_args(Decay)


def learning_rate(
    step: int,
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    decay: Decay = "inverse_sqrt",
    total_steps: int | None = None,
) -> float:
    """The learning rate at optimizer step ``step`` (>= 1), times ``scale``: the paper's, or
    with ``decay="linear"`` its warmup and peak, then linear to zero at ``total_steps``."""
    if step < 1:
        raise ValueError(f"step {step} must be >= 1 (steps count optimizer updates from 1)")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps {warmup_steps} must be >= 1")
    if decay == "inverse_sqrt":
        return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    if decay != "linear":
        raise ValueError(f"decay {decay!r} is not one of {', '.join(DECAYS)}")
    if total_steps is None or total_steps < warmup_steps:
        raise ValueError(f"linear decay needs total_steps >= warmup_steps, got {total_steps}")
    peak = scale * (d_model * warmup_steps) ** -0.5
    if step <= warmup_steps:
        return peak * step / warmup_steps
    return peak * max(0.0, (total_steps - step + 1) / (total_steps - warmup_steps + 1))


def lr_lambda(
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    decay: Decay = "inverse_sqrt",
    total_steps: int | None = None,
) -> Callable[[int], float]:
    """A LambdaLR multiplier: LambdaLR's counter ``k`` (0 before the first update) is step
    ``k + 1``."""
    learning_rate(1, d_model, warmup_steps, scale, decay, total_steps)  # bad settings fail here

    def factor(k: int) -> float:
        return learning_rate(k + 1, d_model, warmup_steps, scale, decay, total_steps)

    return factor


def make_optimizer(
    model: nn.Module,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    lr: float = 1.0,
    fused: bool = False,
) -> torch.optim.Adam:
    """Adam over the trainable parameters (shared ones once); ``fused``: one fused kernel for
    the whole update (GPUs), else torch's multi-tensor implementation.

    ``lr`` is 1.0 so that ``make_scheduler``'s multiplier is the learning rate itself.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, fused=fused or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    decay: Decay = "inverse_sqrt",
    total_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule (the paper's unless ``decay`` says otherwise) on an optimizer built with
    ``lr=1.0``; call ``.step()`` after each update."""
    factor = lr_lambda(d_model, warmup_steps, scale, decay, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
