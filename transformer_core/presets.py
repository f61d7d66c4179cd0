"""Architecture presets: the paper's base and big models, every row of Table 3, and a debug size.

Each preset is a function; variants derive from ``base()`` as the paper's Table 3 does.
"""

from __future__ import annotations

from collections.abc import Callable

from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError


def base() -> ModelConfig:
    """Transformer (base): N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1 (65M)."""
    return ModelConfig()


def big() -> ModelConfig:
    """Transformer (big): d_model=1024, d_ff=4096, h=16, P_drop=0.3 (En-De; 0.1 for En-Fr)
    (213M)."""
    return base().replace(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3)


def big_en_fr() -> ModelConfig:
    """The big model as trained on WMT14 En-Fr: the same, with P_drop=0.1."""
    return big().replace(dropout=0.1)


def debug() -> ModelConfig:
    """A tiny model for tests and the CPU quickstart; learns toy tasks in seconds."""
    return base().replace(n_layers=2, d_model=64, d_ff=256, n_heads=4, max_len=512)


def parsing() -> ModelConfig:
    """Section 6.3's constituency parser: 4 layers, d_model=1024 (the big model's other sizes)."""
    return big().replace(n_layers=4, max_len=2048)


# Table 3 rows. Unlisted values are identical to the base model.
_TABLE3: dict[str, dict[str, object]] = {
    "A1": {"n_heads": 1, "d_k": 512, "d_v": 512},
    "A4": {"n_heads": 4, "d_k": 128, "d_v": 128},
    "A16": {"n_heads": 16, "d_k": 32, "d_v": 32},
    "A32": {"n_heads": 32, "d_k": 16, "d_v": 16},
    "B16": {"d_k": 16},
    "B32": {"d_k": 32},
    "C_N2": {"n_layers": 2},
    "C_N4": {"n_layers": 4},
    "C_N8": {"n_layers": 8},
    "C_d256": {"d_model": 256, "d_k": 32, "d_v": 32},
    "C_d1024": {"d_model": 1024, "d_k": 128, "d_v": 128},
    "C_ff1024": {"d_ff": 1024},
    "C_ff4096": {"d_ff": 4096},
    "D_drop0.0": {"dropout": 0.0},
    "D_drop0.2": {"dropout": 0.2},
    "D_ls0.0": {"label_smoothing": 0.0},
    "D_ls0.2": {"label_smoothing": 0.2},
    "E": {"positional": "learned"},
}

# The paper's "params x 10^6" column for each row (None where the paper leaves it blank).
TABLE3_PARAMS_M: dict[str, float | None] = {
    "base": 65,
    "A1": None,
    "A4": None,
    "A16": None,
    "A32": None,
    "B16": 58,
    "B32": 60,
    "C_N2": 36,
    "C_N4": 50,
    "C_N8": 80,
    "C_d256": 28,
    "C_d1024": 168,
    "C_ff1024": 53,
    "C_ff4096": 90,
    "D_drop0.0": None,
    "D_drop0.2": None,
    "D_ls0.0": None,
    "D_ls0.2": None,
    "E": None,
    "big": 213,
}

TABLE3_ROWS: tuple[str, ...] = tuple(_TABLE3)


def table3(row: str) -> ModelConfig:
    """The base model with the changes of one Table 3 row, e.g. ``table3("A16")`` or ``"C_N2"``."""
    if row not in _TABLE3:
        raise ConfigError("preset", f"unknown Table 3 row {row!r}; rows are {', '.join(_TABLE3)}")
    return base().replace(**_TABLE3[row])


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "debug": debug,
    "base": base,
    "big": big,
    "big_en_fr": big_en_fr,
    "parsing": parsing,
}


def get(name: str) -> ModelConfig:
    """A preset by name: ``debug``, ``base``, ``big``, ``big_en_fr``, ``parsing`` or
    ``table3:<row>``."""
    if name.startswith("table3:"):
        return table3(name.split(":", 1)[1])
    if name not in PRESETS:
        known = ", ".join([*PRESETS, *(f"table3:{r}" for r in TABLE3_ROWS)])
        raise ConfigError("preset", f"unknown preset {name!r}; known: {known}")
    return PRESETS[name]()
