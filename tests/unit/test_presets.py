"""Presets: the paper's sizes and every Table 3 row."""

from __future__ import annotations

import dataclasses

import pytest

from transformer_core import presets
from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError


def test_base_and_big_match_the_paper():
    base = presets.base()
    assert (base.n_layers, base.d_model, base.d_ff, base.n_heads) == (6, 512, 2048, 8)
    assert (base.head_dim_k, base.head_dim_v, base.dropout, base.label_smoothing) == (
        64,
        64,
        0.1,
        0.1,
    )
    assert base.positional == "sinusoidal" and base.share_embeddings
    big = presets.big()
    assert (big.n_layers, big.d_model, big.d_ff, big.n_heads, big.dropout) == (
        6,
        1024,
        4096,
        16,
        0.3,
    )
    assert big.head_dim_k == 64
    assert presets.big_en_fr().dropout == 0.1


@pytest.mark.parametrize("row", presets.TABLE3_ROWS)
def test_table3_rows_differ_from_base_only_where_the_paper_says(row: str):
    config = presets.table3(row)
    base = presets.base()
    changed = {
        f.name
        for f in dataclasses.fields(ModelConfig)
        if getattr(config, f.name) != getattr(base, f.name)
    }
    assert changed, row
    assert changed <= {
        "n_heads",
        "d_k",
        "d_v",
        "n_layers",
        "d_model",
        "d_ff",
        "dropout",
        "label_smoothing",
        "positional",
    }


def test_table3_row_a_keeps_total_attention_width():
    for row in ("A1", "A4", "A16", "A32"):
        c = presets.table3(row)
        assert c.n_heads * c.head_dim_k == 512 and c.n_heads * c.head_dim_v == 512


def test_unknown_row_and_preset():
    with pytest.raises(ConfigError, match="unknown Table 3 row"):
        presets.table3("Z")
    with pytest.raises(ConfigError, match="unknown preset"):
        presets.get("gigantic")
    assert presets.get("table3:E").positional == "learned"


def test_model_config_validation_and_round_trip():
    with pytest.raises(ConfigError, match="n_heads: 7 does not divide d_model 512"):
        ModelConfig(n_heads=7)
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(dropout=-0.1)
    with pytest.raises(ConfigError, match="special ids"):
        ModelConfig(bos_id=0)
    config = presets.debug()
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="wat: unknown key"):
        ModelConfig.from_dict({**config.to_dict(), "wat": 1})
