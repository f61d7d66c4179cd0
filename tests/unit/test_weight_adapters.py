"""weight_adapters: every adapter has the protocol's shape, and where both directions exist,
our state dict goes out and comes back unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tiny_models import V, tiny_model

from weight_adapters import WeightsError, weight_errors_as
from weight_adapters.ctranslate2 import CTranslate2Adapter
from weight_adapters.fairseq import FairseqAdapter
from weight_adapters.fairseq_vocab import Vocabulary
from weight_adapters.marian import MarianAdapter
from weight_adapters.protocol import StateDictAdapter

LAYOUTS = [{}, {"share_embeddings": False}, {"norm_first": True}, {"positional": "learned"}]
"""Tied and untied embeddings, pre-norm with final norms, a learned position table."""


def adapters() -> dict[str, StateDictAdapter]:
    model = tiny_model()
    ids = list(range(V))
    fairseq = FairseqAdapter(model.state_dict(), model.config, Vocabulary(ids, ids), Path("x.pt"))
    return {
        "fairseq": fairseq,
        "marian": MarianAdapter.of(model),
        "ctranslate2": CTranslate2Adapter(model.config),
    }


@pytest.mark.parametrize("name", ["fairseq", "marian", "ctranslate2"])
def test_every_adapter_implements_the_protocol(name: str) -> None:
    adapter = adapters()[name]
    assert isinstance(adapter, StateDictAdapter)
    for method in ("from_ours", "to_ours"):  # defined by the adapter, not inherited
        assert method in type(adapter).__dict__


def assert_same(back: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> None:
    assert sorted(back) == sorted(ours)
    for name, tensor in ours.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("changes", LAYOUTS)
def test_ctranslate2_round_trip_gives_our_state_dict_back(changes: dict) -> None:
    model = tiny_model(seed=1, **changes)
    adapter = CTranslate2Adapter(model.config)
    theirs = adapter.from_ours(model.state_dict())
    assert "encoder/layer_0/self_attention/linear_0/weight" in theirs  # q, k, v fused
    assert_same(adapter.to_ours(theirs), model.state_dict())


@pytest.mark.parametrize("changes", LAYOUTS[:2])
def test_marian_round_trip_gives_our_state_dict_back(changes: dict) -> None:
    model = tiny_model(seed=1, **changes)
    adapter = MarianAdapter.of(model)
    theirs = adapter.from_ours(model.state_dict())
    shared = "model.shared.weight" in theirs
    assert shared == (changes == {})  # each shared matrix once, under Marian's name
    assert_same(adapter.to_ours(theirs), model.state_dict())


def test_ctranslate2_names_are_the_specs_own() -> None:
    pytest.importorskip("ctranslate2")
    from weight_adapters.ctranslate2 import build_spec

    model = tiny_model(norm_first=True)
    pieces = ["<pad>", "<unk>", "<s>", "</s>", *(f"w{i}" for i in range(V - 4))]
    names = set(CTranslate2Adapter(model.config).from_ours(model.state_dict()))
    leaves = ("weight", "bias", "gamma", "beta", "encodings")
    weights = {n for n in build_spec(model, pieces).variables() if n.endswith(leaves)}
    assert names == weights  # the spec's settings aside, every variable is the adapter's


def test_a_one_way_adapter_says_so_and_refusals_keep_their_words() -> None:
    with pytest.raises(NotImplementedError, match="imported from fairseq"):
        adapters()["fairseq"].from_ours(tiny_model().state_dict())
    model = tiny_model(norm_first=True)
    with pytest.raises(ValueError, match=r"^norm_first=True \(pre-norm\) cannot be exported"):
        with weight_errors_as(ValueError):
            MarianAdapter.of(model).from_ours(model.state_dict())
    with pytest.raises(WeightsError, match="d_k=8 differs from d_v=16"):
        CTranslate2Adapter(tiny_model(d_k=8).config).from_ours({})
