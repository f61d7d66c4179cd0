"""transformer_core: the Transformer of Vaswani et al. 2017 in plain PyTorch (torch, numpy, stdlib)."""

from transformer_core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ConfigError, ModelConfig
from transformer_core.decoding import DecoderState
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
