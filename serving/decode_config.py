"""How a translator decodes: ``DecodeConfig`` (the config's ``decode`` section, and a registered
model's ``decode.json``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsing.linearize import FORMS
from serving.ct2 import COMPUTE_TYPES
from transformer_core.config import ConfigError
from transformer_core.search_settings import LENGTH_NORMS

__all__ = ["DECODE_DTYPES", "ENGINES", "DecodeConfig"]

DECODE_DTYPES = ("float32", "bfloat16")
ENGINES = ("torch", "ctranslate2")


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """Beam search settings (paper section 6.1)."""

    beam_size: int = 4
    """Beam width."""
    alpha: float = 0.6
    """Length penalty exponent: of ((5+len)/6)^alpha, or of len^alpha with length_norm fairseq."""
    length_norm: str = "gnmt"
    """gnmt (the paper's penalty) or fairseq (the summed log-probability / len^alpha, as
    fairseq-generate's --lenpen: a fairseq recipe's decoding)."""
    max_len_offset: int = 50
    """Maximum output length = source length + this."""
    max_tokens_per_batch: int = 4096
    """Source tokens per decoding batch."""
    num_actors: int = 1
    """Ray Data decoding actors of the translate stage."""
    dtype: str = "float32"
    """Engine torch: weights and activations while decoding: float32, or bfloat16 (on GPUs, and
    on CPUs with AVX512-BF16 or AMX, faster than float32; slow on CPUs without them:
    docs/translation.md)."""
    engine: str = "torch"
    """Who runs the search: torch (our beam search) or ctranslate2 (CTranslate2's, same
    settings; the checkpoint is exported once, next to it)."""
    compute_type: str = "default"
    """Engine ctranslate2: CTranslate2's compute type (default, auto, int8, int8_float32,
    int8_float16, int8_bfloat16, int16, float16, bfloat16, float32)."""
    threads: int = 0
    """Intra-op CPU threads of the engine; 0 leaves the library's default."""
    tree_constraint: str | None = None
    """Parsing (engine torch): t2t, vinyals or words keeps every hypothesis a well-formed tree of
    that linearized form with one leaf per source word (``parsing.constrain``); null:
    unconstrained."""

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ConfigError("beam_size", f"{self.beam_size} must be >= 1")
        if self.length_norm not in LENGTH_NORMS:
            raise ConfigError(
                "length_norm", f"{self.length_norm!r} is not one of {', '.join(LENGTH_NORMS)}"
            )
        if self.dtype not in DECODE_DTYPES:
            raise ConfigError("dtype", f"{self.dtype!r} is not one of {', '.join(DECODE_DTYPES)}")
        if self.engine not in ENGINES:
            raise ConfigError("engine", f"{self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.compute_type not in COMPUTE_TYPES:
            raise ConfigError(
                "compute_type", f"{self.compute_type!r} is not one of {', '.join(COMPUTE_TYPES)}"
            )
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise ConfigError("threads", f"{self.threads!r} must be an integer >= 0")
        if self.tree_constraint is not None and self.tree_constraint not in FORMS:
            raise ConfigError(
                "tree_constraint",
                f"{self.tree_constraint!r} is not one of null, {', '.join(FORMS)}",
            )
        if self.tree_constraint and self.engine != "torch":
            raise ConfigError("tree_constraint", "needs engine torch (our beam search)")
        # Each engine has its own precision setting; the other one's would be silently ignored.
        if self.engine == "torch" and self.compute_type != "default":
            raise ConfigError("compute_type", "applies to engine ctranslate2; torch uses dtype")
        if self.engine == "ctranslate2" and self.dtype != "float32":
            raise ConfigError("dtype", "applies to engine torch; ctranslate2 uses compute_type")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecodeConfig:
        """From stored JSON (a registered model's decode.json), ignoring fields this code
        version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
