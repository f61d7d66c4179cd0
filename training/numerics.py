"""What a training step computes in: the autocast dtype (``train.precision`` on the device at
hand), what is compiled (``train.compile``, eager where inductor finds no C++ compiler) and the
loss function (plain, fused, compiled)."""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable

import torch

from training.config import Compiled, TrainConfig
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
    """bf16 where training autocasts (``train.precision``: bf16 on a GPU or on a CPU that has
    native bf16; auto on a GPU); None: float32 throughout."""
    if config.precision == "float32":
        return None
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and config.precision == "bf16":
        if native_cpu_bf16():
            return torch.bfloat16
        log.warning(
            "train.precision: bf16: this CPU has no native bf16 (AVX512-BF16 or AMX): float32"
        )
    return None


def cpp_compiler() -> str | None:
    """The C++ compiler inductor builds a CPU graph's kernels with: the first of its candidates
    (torch's ``_inductor.config.cpp.cxx``: ``$CXX`` as torch found it, else g++; pinned torch)
    on the PATH; None where there is none, and compiling would fail at the first step."""
    from torch._inductor import config as inductor

    candidates = inductor.cpp.cxx
    if isinstance(candidates, str):
        candidates = (candidates,)
    found = (shutil.which(c) for c in candidates if c)  # None: a conda download, opt-in
    return next((path for path in found if path), None)


def compiled_parts(config: TrainConfig, device: torch.device) -> tuple[Compiled, ...]:
    """What training compiles: ``train.compile``; nothing, with one warning, on a CPU where
    inductor finds no C++ compiler (a GPU's kernels are Triton's)."""
    if not config.compile or device.type != "cpu" or cpp_compiler() is not None:
        return config.compile
    eager = "the model and the loss run" if "model" in config.compile else "the loss runs"
    log.warning(
        "train.compile: [%s]: no C++ compiler (g++, or the one $CXX names) on this machine: "
        "%s eagerly",
        ", ".join(config.compile),
        eager,
    )
    return ()


def loss_function(
    config: TrainConfig,
    module: Transformer,
    device: torch.device,
    dtype: torch.dtype | None,
    compiled: tuple[Compiled, ...],
) -> Callable:
    """The training loss on the model's output: label-smoothed NLL of the logits or, with
    ``fused_loss``, of the states through the output projection in chunks (the projection in
    ``dtype``, autocast's); compiled where ``compiled`` (``compiled_parts``) names anything:
    the model compiles its loss too, and with ``fused_loss`` only the chunks' loss is."""
    if not config.fused_loss:
        return torch.compile(label_smoothed_nll, dynamic=True) if compiled else label_smoothed_nll
    chunk = torch.compile(chunk_loss_and_grad, dynamic=True) if compiled else None
    return functools.partial(
        linear_label_smoothed_nll,
        weight=module.generator.weight,
        # The loss runs outside the autocast region: the projection's dtype is explicit.
        dtype=dtype,
        chunk_logits=CHUNK_LOGITS if device.type == "cuda" else CPU_CHUNK_LOGITS,
        **({"chunk_fn": chunk} if chunk is not None else {}),
    )
