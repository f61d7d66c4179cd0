"""Parameter counts of base, big and every Table 3 row against the paper's column.

Models are built on the ``meta`` device: shapes without storage, so even big (213M) is instant.
"""

from __future__ import annotations

import pytest
import torch

from transformer_core import ModelConfig, Transformer, count_parameters, presets

VOCAB = 37_000  # the paper's shared En-De BPE vocabulary
TOLERANCE = 0.07  # see docs/parameters.md: the paper's column runs ~2M above a 37k-vocab count

CASES = {"base": presets.base(), "big": presets.big()}
CASES.update({row: presets.table3(row) for row in presets.TABLE3_ROWS})


def meta_count(config: ModelConfig, vocab: int = VOCAB) -> int:
    with torch.device("meta"):
        return count_parameters(Transformer(config, vocab))


def analytic_count(c: ModelConfig, vocab: int = VOCAB) -> int:
    """The count written out from the paper's description (biases in every linear but the
    pre-softmax projection; two LayerNorm vectors per sub-layer)."""
    D, F, h, dk, dv = c.d_model, c.d_ff, c.n_heads, c.head_dim_k, c.head_dim_v
    attention = 2 * (D * h * dk + h * dk) + (D * h * dv + h * dv) + (h * dv * D + D)
    ffn = D * F + F + F * D + D
    norm = 2 * D
    encoder = c.n_layers * (attention + ffn + 2 * norm)
    decoder = c.n_layers * (2 * attention + ffn + 3 * norm)
    positions = c.max_len * D if c.positional == "learned" else 0
    return vocab * D + positions + encoder + decoder


@pytest.mark.parametrize("name", list(CASES))
def test_count_matches_the_analytic_formula(name):
    assert meta_count(CASES[name]) == analytic_count(CASES[name])


@pytest.mark.parametrize("name", [n for n in CASES if presets.TABLE3_PARAMS_M[n] is not None])
def test_count_is_within_tolerance_of_the_paper(name):
    ours = meta_count(CASES[name]) / 1e6
    paper = presets.TABLE3_PARAMS_M[name]
    assert abs(ours - paper) / paper <= TOLERANCE, f"{name}: ours {ours:.1f}M vs paper {paper}M"


def test_every_row_has_a_paper_entry():
    assert set(CASES) == set(presets.TABLE3_PARAMS_M)


def test_a_wrong_architecture_is_caught():
    # The tolerance is tight enough to tell neighbouring rows apart (C_ff1024 vs base).
    ours = meta_count(presets.table3("C_ff1024")) / 1e6
    assert abs(ours - presets.TABLE3_PARAMS_M["base"]) / presets.TABLE3_PARAMS_M["base"] > TOLERANCE
