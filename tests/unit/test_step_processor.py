"""The one search entry: ``SearchSettings`` and step processors plugged into the beam step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from transformer_core import EOS_ID, PAD_ID, Transformer, presets
from transformer_core.search import SearchSettings, search
from transformer_core.search_settings import StepProcessor

V = 24


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(presets.debug().replace(max_len=128), V).eval()


def _sources(seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (5, 8), generator=g)
    src[1, 5:] = PAD_ID
    src[3, 2:] = PAD_ID
    return src


class Forbid:
    """Never lets ``tokens`` through."""

    def __init__(self, *tokens: int) -> None:
        self.tokens = list(tokens)

    def begin(self, src: Tensor, limits: Tensor, beam_size: int) -> None:
        pass

    def mask(self, log_probs: Tensor, first: bool) -> None:
        log_probs[:, self.tokens] = float("-inf")

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        pass


class NoRepeat:
    """Forbids a token its beam already emitted (and EOS, so that outputs are long): right only
    if ``advance`` follows the beams."""

    def begin(self, src: Tensor, limits: Tensor, beam_size: int) -> None:
        self.k = beam_size
        self.seen = torch.zeros(src.size(0) * beam_size, V, dtype=torch.bool)  # (B*k, V)

    def mask(self, log_probs: Tensor, first: bool) -> None:
        seen = self.seen[:: self.k] if first else self.seen
        log_probs.masked_fill_(seen, float("-inf"))
        log_probs[:, EOS_ID] = float("-inf")

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        self.seen = self.seen[rows]
        self.seen[torch.arange(rows.numel()), tokens] = True


def _emitted(found: list[list]) -> list[int]:
    return [t for hyps in found for h in hyps for t in h.tokens]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_forbidden_token_is_never_emitted(beam):
    model, src = _model(), _sources()
    settings = SearchSettings(beam_size=beam, n_best=beam, max_len_offset=6)
    # A random model ends at once; without EOS every output runs to its limit.
    plain = _emitted(search(model, src, settings, Forbid(EOS_ID)))
    favourite = max(set(plain), key=plain.count)
    forbid: StepProcessor = Forbid(EOS_ID, favourite)
    assert favourite not in _emitted(search(model, src, settings, forbid))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_step_processor_follows_the_beams(seed):
    model, src = _model(seed), _sources(seed)
    settings = SearchSettings(beam_size=4, n_best=4, max_len_offset=10)
    plain = [h.tokens for hyps in search(model, src, settings, Forbid(EOS_ID)) for h in hyps]
    assert any(len(set(t)) < len(t) for t in plain)  # the check below can fail
    for hyps in search(model, src, settings, NoRepeat()):
        assert hyps
        for h in hyps:
            assert len(set(h.tokens)) == len(h.tokens), h.tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_greedy_loop_scores_as_the_beam_loop_at_beam_one(seed):
    model, src = _model(seed), _sources(seed)
    settings = SearchSettings(beam_size=1, alpha=0.6, max_len_offset=6)
    beam = search(model, src, settings)
    greedy = search(model, src, dataclasses.replace(settings, greedy=True))
    assert [h.tokens for hyps in greedy for h in hyps] == [h.tokens for hyps in beam for h in hyps]
    # Not bit-equal: the beam loop drops finished rows from the batch, the greedy loop keeps them.
    assert [h.score for hyps in greedy for h in hyps] == pytest.approx(
        [h.score for hyps in beam for h in hyps], rel=1e-5
    )


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="beam_size"):
        SearchSettings(beam_size=0)
    with pytest.raises(ValueError, match="n_best"):
        SearchSettings(beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="alpha"):
        SearchSettings(alpha=-0.1)
    with pytest.raises(ValueError, match="one beam"):
        SearchSettings(beam_size=2, greedy=True)
    with pytest.raises(ValueError, match="no step processor"):
        search(_model(), _sources(), SearchSettings(beam_size=1, greedy=True), Forbid(EOS_ID))
