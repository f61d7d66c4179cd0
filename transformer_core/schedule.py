"""The optimiser and learning-rate schedule of paper section 5.3.

``lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``: linear warmup to a peak at
``step == warmup_steps``, then decay with the inverse square root of the step. Steps count
optimizer updates from 1; step 0 is an error (the formula is infinite there), and
``lr_lambda`` maps LambdaLR's 0-based counter onto it so that the first update uses step 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def learning_rate(step: int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> float:
    """The paper's learning rate at optimizer step ``step`` (>= 1), times ``scale``."""
    if step < 1:
        raise ValueError(f"step {step} must be >= 1 (steps count optimizer updates from 1)")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps {warmup_steps} must be >= 1")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def lr_lambda(d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> Callable[[int], float]:
    """A LambdaLR multiplier: LambdaLR's counter ``k`` (0 before the first update) is step
    ``k + 1``."""

    def factor(k: int) -> float:
        return learning_rate(k + 1, d_model, warmup_steps, scale)

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
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """The paper's schedule on an optimizer built with ``lr=1.0``; call ``.step()`` after each
    update."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(d_model, warmup_steps, scale))
