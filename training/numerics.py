"""What a training step computes in: the autocast dtype (``train.bf16`` on CUDA,
``train.cpu_bf16`` on a CPU with native bf16) and the loss function (plain, fused, compiled)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from training.config import TrainConfig
from transformer_core.loss import (
    CHUNK_LOGITS,
    CPU_CHUNK_LOGITS,
    chunk_loss_and_grad,
    label_smoothed_nll,
    linear_label_smoothed_nll,
)
from transformer_core.model import Transformer

log = logging.getLogger(__name__)


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). torch's private checks
    (pinned torch): its public ``mkldnn`` one also says yes where oneDNN only emulates bf16."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def autocast_dtype(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    """bf16 where training autocasts (``train.bf16`` on CUDA, ``train.cpu_bf16`` on a CPU that
    has native bf16); None: float32 throughout."""
    if device.type == "cuda":
        return torch.bfloat16 if config.bf16 else None
    if device.type == "cpu" and config.cpu_bf16:
        if native_cpu_bf16():
            return torch.bfloat16
        log.warning("train.cpu_bf16: this CPU has no native bf16 (AVX512-BF16 or AMX): float32")
    return None


def loss_function(
    config: TrainConfig, module: Transformer, device: torch.device, dtype: torch.dtype | None
) -> Callable:
    """The training loss on the model's output: label-smoothed NLL of the logits or, with
    ``fused_loss``, of the states through the output projection in chunks (the projection in
    ``dtype``, autocast's); compiled with ``compile``, only the chunks' loss with
    ``compile_loss``."""
    if not config.fused_loss:
        if config.compile:
            return torch.compile(label_smoothed_nll, dynamic=True)
        return label_smoothed_nll
    compiled = config.compile or config.compile_loss
    chunk = torch.compile(chunk_loss_and_grad, dynamic=True) if compiled else None
    return functools.partial(
        linear_label_smoothed_nll,
        weight=module.generator.weight,
        # The loss runs outside the autocast region: the projection's dtype is explicit.
        dtype=dtype,
        chunk_logits=CHUNK_LOGITS if device.type == "cuda" else CPU_CHUNK_LOGITS,
        **({"chunk_fn": chunk} if chunk is not None else {}),
    )
