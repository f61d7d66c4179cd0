"""The model's configuration: one frozen, keyword-only dataclass, validated on construction.
The special ids (``transformer_core.special_ids``) and ``ConfigError`` / ``check_choices``
(``transformer_core.config_checks``) are importable from here too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from transformer_core.config_checks import ConfigError, check_choices
from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

Decay = Literal["inverse_sqrt", "linear"]
"""The learning rate after the warmup (``train.decay``; ``transformer_core.schedule``)."""

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "ConfigError",
    "ModelConfig",
    "check_choices",
]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of the encoder-decoder Transformer (paper section 3, Table 3 columns)."""

    n_layers: int = 6
    """N: number of layers in the encoder (and in the decoder, unless decoder_layers says)."""
    decoder_layers: int | None = None
    """Layers in the decoder; null means n_layers (the paper's one N). A distillation student
    keeps a deep encoder and a shallow decoder (docs/distillation.md)."""
    d_model: int = 512
    """Width of every residual stream, embedding and sub-layer output."""
    d_ff: int = 2048
    """Inner width of the position-wise feed-forward network."""
    n_heads: int = 8
    """h: number of attention heads."""
    d_k: int | None = None
    """Per-head query/key width; None means d_model // n_heads."""
    d_v: int | None = None
    """Per-head value width; None means d_model // n_heads."""
    dropout: float = 0.1
    """P_drop: on embeddings+positions and on every sub-layer output before the residual add."""
    attention_dropout: float = 0.0
    """Dropout on attention weights (the paper does not use it; tensor2tensor's base has 0)."""
    label_smoothing: float = 0.1
    """epsilon_ls of the training objective (Table 3 row D varies it)."""
    init: Literal["torch", "fairseq"] = "torch"
    """Initial weights of the linear layers. torch: PyTorch's own Transformer layers' (query/key/
    value Xavier at gain 1/sqrt(2), attention output and feed-forward nn.Linear's default, zero
    attention biases). fairseq: fairseq 0.9's Transformer (behind the published Multi30k recipe):
    attention output and feed-forward Xavier at gain 1 with zero biases, query/key/value Xavier
    at gain 1/sqrt(2) with nn.Linear's default biases, the padding row of the embedding zero."""
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    """Positional encoding: the paper's sinusoids, or learned embeddings (Table 3 row E)."""
    max_len: int = 1024
    """Longest sequence the positional table covers."""
    share_embeddings: bool = True
    """Tie source embedding, target embedding and pre-softmax projection (joint vocabulary)."""
    norm_first: bool = False
    """Layer norm placement. False: the paper's post-norm, LayerNorm(x + Dropout(Sublayer(x))).
    True: pre-norm, x + Dropout(Sublayer(LayerNorm(x))), with a final LayerNorm after the
    encoder and after the decoder (tensor2tensor's later default; steadier on small data)."""
    pad_id: int = PAD_ID
    """Padding token id (ignored by attention and by the loss)."""
    bos_id: int = BOS_ID
    """Beginning-of-sentence id: the decoder's first input."""
    eos_id: int = EOS_ID
    """End-of-sentence id: ends a hypothesis."""

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("n_layers", "d_model", "d_ff", "n_heads", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, f"{value!r} must be a positive integer")
        for name in ("d_k", "d_v", "decoder_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(name, f"{value!r} must be a positive integer or null")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model {self.d_model}")
        for name in ("dropout", "attention_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(name, f"{value!r} must be in [0, 1)")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        if len(set(ids.values())) != len(ids):
            raise ConfigError("pad_id", f"special ids must differ, got {ids}")

    @property
    def n_decoder_layers(self) -> int:
        """Decoder layers actually built: ``decoder_layers``, else ``n_layers``."""
        return self.decoder_layers if self.decoder_layers is not None else self.n_layers

    @property
    def head_dim_k(self) -> int:
        """Per-head query/key width actually used."""
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        """Per-head value width actually used."""
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form, as stored next to every checkpoint."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Rebuild from ``to_dict`` output; unknown keys are an error naming the key."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise ConfigError(str(key), "unknown key")
        return cls(**data)
