"""transformer_core: the Transformer of Vaswani et al. 2017 in plain PyTorch (torch, numpy, stdlib).

The torch parts load on first use (PEP 562): ``transformer_core.config`` and
``transformer_core.folders`` are torch-free, so the data workers that need only them (clean,
shard) start without importing torch (~2 s each)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from transformer_core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ConfigError, ModelConfig

if TYPE_CHECKING:
    from transformer_core.decoder_state import DecoderState
    from transformer_core.model import Memory, Transformer, count_parameters

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "ConfigError",
    "DecoderState",
    "Memory",
    "ModelConfig",
    "Transformer",
    "count_parameters",
]

_LAZY = {
    "DecoderState": "transformer_core.decoder_state",
    "Memory": "transformer_core.model",
    "Transformer": "transformer_core.model",
    "count_parameters": "transformer_core.model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'transformer_core' has no attribute {name!r}")
