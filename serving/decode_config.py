"""How a translator decodes: ``DecodeConfig`` (the config's ``decode`` section, and a registered
model's ``decode.json``): the beam search's settings, which every search here shares
(``transformer_core.search_settings.BeamSettings``), and who runs it, where and how fast."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from parsing.linearize import Form
from serving.ct2_options import ComputeType
from transformer_core.config_checks import ConfigError
from transformer_core.search_settings import BeamSettings

__all__ = ["DecodeConfig", "DecodeDtype", "Engine"]

DecodeDtype = Literal["float32", "bfloat16"]
"""Engine torch's weights and activations while decoding."""
Engine = Literal["torch", "ctranslate2"]
"""Who runs the search."""


@dataclass(frozen=True, kw_only=True)
class DecodeConfig(BeamSettings):
    """Beam search settings (paper section 6.1; ``BeamSettings``'s fields) and the engine."""

    max_tokens_per_batch: int = 4096
    """Source tokens per decoding batch."""
    num_actors: int = 1
    """Ray Data decoding actors of the translate stage."""
    dtype: DecodeDtype = "float32"
    """Engine torch: weights and activations while decoding: float32, or bfloat16 (on GPUs, and
    on CPUs with AVX512-BF16 or AMX, faster than float32; slow on CPUs without them:
    docs/translation.md)."""
    engine: Engine = "torch"
    """Who runs the search: torch (our beam search) or ctranslate2 (CTranslate2's, same
    settings; the checkpoint is exported once, next to it)."""
    compute_type: ComputeType = "default"
    """Engine ctranslate2: CTranslate2's compute type (default, auto, int8, int8_float32,
    int8_float16, int8_bfloat16, int16, float16, bfloat16, float32)."""
    threads: int = 0
    """Intra-op CPU threads of the engine; 0 leaves the library's default."""
    tree_constraint: Form | None = None
    """Parsing (engine torch): t2t, vinyals or words keeps every hypothesis a well-formed tree of
    that linearized form with one leaf per source word (``parsing.constrain``); null:
    unconstrained."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise ConfigError("threads", f"{self.threads!r} must be an integer >= 0")
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
