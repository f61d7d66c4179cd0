"""Greedy and beam search: against each other, against exhaustive enumeration, and their limits."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers.tiny_models import best_tokens

from transformer_core import BOS_ID, EOS_ID, PAD_ID, Transformer, decoding, presets
from transformer_core.search import SearchSettings, length_penalty, search


def _model(vocab: int = 24, seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(presets.debug().replace(max_len=128, **changes), vocab).eval()


def _best(model: Transformer, src: torch.Tensor, **settings) -> list:
    """The best ``Hypothesis`` (tokens and score) per source row."""
    return [hyps[0] for hyps in search(model, src, SearchSettings(**settings))]


def _sources(vocab: int = 24, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (5, 8), generator=g)
    src[1, 5:] = PAD_ID
    src[3, 2:] = PAD_ID
    return src


class Rigged(Transformer):
    """A model whose logits ``edit`` rewrites at every search step, cached or not (the
    ``rigged_steps`` fixture routes ``decoding.decode_step``, which both go through, via it)."""

    def edit(self, logits: torch.Tensor, start: int) -> torch.Tensor:
        """Logits (B, T, V) of positions start .. start + T - 1 -> what the model returns."""
        return logits


@pytest.fixture(autouse=True)
def rigged_steps(monkeypatch):
    step = decoding.decode_step

    def decode_step(model, tgt_in, state):
        logits = step(model, tgt_in, state)  # keeps the state's bookkeeping
        if isinstance(model, Rigged):
            logits = model.edit(logits, state.length - tgt_in.size(1))
        return logits

    monkeypatch.setattr(decoding, "decode_step", decode_step)


class NeverEnds(Rigged):
    """A model that cannot emit EOS, so every output runs to its length limit."""

    def edit(self, logits, start):
        logits[..., EOS_ID] = float("-inf")
        return logits


class EndsAt(Rigged):
    """A model that emits EOS exactly as its ``end + 1``-th token: outputs hold ``end`` words."""

    end = 3

    def edit(self, logits, start):
        positions = torch.arange(start, start + logits.size(1))
        logits[:, positions < self.end, EOS_ID] = float("-inf")
        logits[:, positions >= self.end, EOS_ID] = 100.0
        return logits


class Scripted(Rigged):
    """Next-token probabilities set by position alone: ``first`` at the first output position,
    ``later`` after it (token id -> probability; every other token is ~impossible)."""

    first: dict[int, float] = {}
    later: dict[int, float] = {}

    def edit(self, logits, start):
        scripted = torch.full_like(logits, -1e4)
        for t in range(logits.size(1)):
            for token, p in (self.first if start + t == 0 else self.later).items():
                scripted[:, t, token] = math.log(p)
        return scripted


def _scripted(first: dict[int, float], later: dict[int, float]) -> Scripted:
    torch.manual_seed(0)
    model = Scripted(presets.debug(), 8).eval()
    model.first, model.later = first, later
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model = _model(seed=seed)
    src = _sources(seed=seed)
    greedy = best_tokens(model, src, max_len_offset=6, greedy=True, beam_size=1)
    assert best_tokens(model, src, beam_size=1, max_len_offset=6) == greedy
    assert any(len(out) > 0 for out in greedy)


def test_cache_and_full_recompute_agree():
    model = _model(seed=4)
    src = _sources(seed=4)
    greedy = {"greedy": True, "beam_size": 1, "max_len_offset": 6}
    assert best_tokens(model, src, use_cache=False, **greedy) == best_tokens(model, src, **greedy)
    cached = _best(model, src, beam_size=4, max_len_offset=6)
    full = _best(model, src, beam_size=4, max_len_offset=6, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in full]
    assert [h.score for h in cached] == pytest.approx([h.score for h in full], abs=1e-4)


def test_batched_results_come_back_in_input_order():
    model = _model(seed=5)
    src = _sources(seed=5)
    batched = best_tokens(model, src, beam_size=3, max_len_offset=6)
    for row, out in zip(src, batched, strict=True):
        alone = row[row != PAD_ID][None]  # (1, S_i): the sentence without padding
        assert best_tokens(model, alone, beam_size=3, max_len_offset=6) == [out]


def _exhaustive_best(
    model: Transformer, src: torch.Tensor, limit: int, alpha: float, norm: str = "gnmt"
):
    """Score every output of length <= limit (EOS-terminated below the limit, cut at it)."""
    words = [t for t in range(model.tgt_vocab_size) if t not in (PAD_ID, BOS_ID, EOS_ID)]
    outputs = [list(s) for n in range(limit + 1) for s in itertools.product(words, repeat=n)]
    best = None
    model.eval()
    with torch.no_grad():
        memory = model.encode(src)
        for out in outputs:
            target = out + ([EOS_ID] if len(out) < limit else [])
            tgt_in = torch.tensor([[BOS_ID] + target[:-1]])
            log_probs = torch.log_softmax(model.decode(tgt_in, memory).float(), dim=-1)[0]
            total = log_probs[torch.arange(len(target)), torch.tensor(target)].sum().item()
            score = total / length_penalty(len(target), alpha, norm)
            if best is None or score > best[1]:
                best = (out, score)
    return best, len(outputs)


def _exhaustive_ranking(model, src, limit, alpha):
    """Every output up to ``limit`` tokens with its true score, best first."""
    memory = model.encode(src)
    words = [1, *range(4, model.tgt_vocab_size)]  # <unk> and the words (search bans pad, bos)
    scored = []
    with torch.no_grad():
        for n in range(limit + 1):
            for out in itertools.product(words, repeat=n):
                target = list(out) + ([EOS_ID] if n < limit else [])
                if not target:
                    continue
                tgt_in = torch.tensor([[BOS_ID] + target[:-1]])
                log_probs = torch.log_softmax(model.decode(tgt_in, memory).float(), dim=-1)[0]
                total = log_probs[torch.arange(len(target)), torch.tensor(target)].sum().item()
                scored.append((list(out), total / length_penalty(len(target), alpha)))
    return sorted(scored, key=lambda pair: -pair[1])


@pytest.mark.parametrize(
    "seed,alpha,norm",
    [
        (0, 0.6, "gnmt"),
        (1, 0.0, "gnmt"),
        (2, 1.0, "gnmt"),
        (3, 0.6, "gnmt"),
        (2, 1.0, "fairseq"),
        (3, 2.0, "fairseq"),
    ],
)
def test_wide_beam_finds_the_exhaustive_optimum(seed, alpha, norm):
    # Vocabulary: pad, unk, bos, eos and two words -> 3 producible words, outputs up to 3 long:
    # 1 + 3 + 9 + 27 = 40 sequences, all of which a beam of 64 keeps.
    model = _model(vocab=6, seed=seed)
    src = torch.tensor([[4, 5, 5, 4]])
    (tokens, score), n = _exhaustive_best(model, src, limit=3, alpha=alpha, norm=norm)
    assert n == 40
    [found] = _best(model, src, beam_size=64, alpha=alpha, max_len=3, length_norm=norm)
    assert found.tokens == tokens
    assert found.score == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_n_best_are_the_best_distinct_outputs_with_true_scores(alpha):
    # A beam as wide as the 40 sequences keeps them all: its 5 best are the enumeration's 5 best.
    model = _model(vocab=6, seed=4)
    src = torch.tensor([[4, 5, 5, 4]])
    [found] = search(model, src, SearchSettings(beam_size=64, alpha=alpha, n_best=5, max_len=3))
    ranked = _exhaustive_ranking(model, src, limit=3, alpha=alpha)
    assert [h.tokens for h in found] == [tokens for tokens, _ in ranked[:5]]
    for h, (_, score) in zip(found, ranked, strict=False):
        assert h.score == pytest.approx(score, abs=1e-5)
    [best] = _best(model, src, beam_size=64, alpha=alpha, max_len=3)
    assert best == found[0]


def test_n_best_asks_for_at_most_the_beam():
    model = _model()
    found = search(model, _sources(), SearchSettings(beam_size=4, n_best=4, max_len_offset=4))
    assert all(len(hyps) == 4 for hyps in found)
    assert all(len({tuple(h.tokens) for h in hyps}) == 4 for hyps in found)
    with pytest.raises(ValueError, match="n_best"):
        SearchSettings(beam_size=4, n_best=5)


def test_narrow_beam_score_is_consistent_with_enumeration():
    # A beam of 2 need not find the optimum, but the score it reports must be the true one.
    model = _model(vocab=6, seed=7)
    src = torch.tensor([[4, 5, 1]])
    [found] = _best(model, src, beam_size=2, alpha=0.6, max_len=3)
    target = found.tokens + ([EOS_ID] if len(found.tokens) < 3 else [])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src, torch.tensor([[BOS_ID] + target[:-1]])), -1)[0]
    total = log_probs[torch.arange(len(target)), torch.tensor(target)].sum().item()
    assert found.score == pytest.approx(total / length_penalty(len(target), 0.6), abs=1e-5)
    best, _ = _exhaustive_best(model, src, limit=3, alpha=0.6)
    assert found.score <= best[1] + 1e-6


def test_outputs_stop_at_source_length_plus_offset():
    torch.manual_seed(0)
    model = NeverEnds(presets.debug(), 24)
    src = _sources()
    src_lens = (src != PAD_ID).sum(1).tolist()
    for outputs in (
        best_tokens(model, src, max_len_offset=3, greedy=True, beam_size=1),
        best_tokens(model, src, beam_size=3, max_len_offset=3),
    ):
        assert [len(o) for o in outputs] == [n + 3 for n in src_lens]
        assert all(EOS_ID not in o and PAD_ID not in o and BOS_ID not in o for o in outputs)
    assert [len(o) for o in best_tokens(model, src, max_len=7, greedy=True, beam_size=1)] == [
        7
    ] * len(src_lens)
    assert [len(o) for o in best_tokens(model, src, beam_size=2, max_len=4)] == [4] * len(src_lens)


def test_eos_ends_the_output_without_being_returned():
    torch.manual_seed(0)
    model = EndsAt(presets.debug(), 24)
    src = _sources()
    assert [len(o) for o in best_tokens(model, src, greedy=True, beam_size=1)] == [
        EndsAt.end
    ] * len(src)
    assert [len(o) for o in best_tokens(model, src, beam_size=4)] == [EndsAt.end] * len(src)


def test_search_stops_once_every_sentence_has_ended():
    torch.manual_seed(0)
    model = EndsAt(presets.debug(), 24)
    calls = []  # one edit per decoder call, cached or not
    edit = model.edit
    model.edit = lambda *args: calls.append(1) or edit(*args)
    src = _sources()
    best_tokens(model, src, max_len_offset=50, greedy=True, beam_size=1)
    assert len(calls) == EndsAt.end + 1  # not source length + 50
    calls.clear()
    best_tokens(model, src, beam_size=4, max_len_offset=50)
    assert len(calls) == EndsAt.end + 1


def test_length_penalty_lets_a_less_probable_open_beam_win():
    # Ending at once scores log 0.55 = -0.60; four words then run to the limit of 10 with
    # probability 0.45 in all: -0.80 / lp(10) = -0.46 with alpha 0.6. Stopping when the open beam's
    # raw score (-0.80) falls below the finished one would wrongly return the empty output.
    model = _scripted(first={EOS_ID: 0.55, 4: 0.45}, later={4: 1.0})
    [best] = _best(model, torch.tensor([[4, 5]]), beam_size=2, max_len=10)
    assert best.tokens == [4] * 10
    assert best.score == pytest.approx(math.log(0.45) / length_penalty(10, 0.6), abs=1e-4)


def test_beam_stops_when_no_open_beam_can_win():
    # EOS first with probability 0.9: no continuation can beat log 0.9 even with the largest
    # length penalty, so the search stops after one step with 1 finished of 4.
    model = _scripted(first={EOS_ID: 0.9, 4: 0.05, 5: 0.05}, later={EOS_ID: 0.9, 4: 0.1})
    calls = []  # one edit per decoder call, cached or not
    edit = model.edit
    model.edit = lambda *args: calls.append(1) or edit(*args)
    assert best_tokens(model, torch.tensor([[4, 5]]), beam_size=4, max_len=10) == [[]]
    assert len(calls) == 1


def test_search_runs_in_eval_mode_and_restores_training():
    model = _model(seed=8, dropout=0.3)
    src = _sources(seed=8)
    model.train()
    first = best_tokens(model, src, beam_size=2, max_len_offset=4)
    assert model.training
    assert best_tokens(model, src, beam_size=2, max_len_offset=4) == first  # no dropout noise
    model.eval()
    assert best_tokens(model, src, beam_size=2, max_len_offset=4) == first


def test_bad_arguments_fail_clearly():
    model = _model()
    with pytest.raises(ValueError, match="beam_size"):
        best_tokens(model, _sources(), beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        best_tokens(model, _sources(), alpha=-1.0)
    with pytest.raises(ValueError, match="empty"):
        best_tokens(model, torch.zeros(0, 4, dtype=torch.long), greedy=True, beam_size=1)


# fairseq-generate's ends (length_rule fairseq): the limit counts the tokens before a forced,
# scored EOS, and EOS never comes first.
FAIRSEQ = {"length_rule": "fairseq", "length_norm": "fairseq", "alpha": 1.0}


class RarelyEnds(Rigged):
    """A model that all but never emits EOS (a finite log-probability, so it can be forced)."""

    def edit(self, logits, start):
        logits[..., EOS_ID] -= 30.0
        return logits


def _exhaustive_fairseq_best(model: Transformer, src: torch.Tensor, limit: int, alpha: float):
    """Score every output of 1..limit words, each followed by EOS, / (words + 1)^alpha."""
    words = [t for t in range(model.tgt_vocab_size) if t not in (PAD_ID, BOS_ID, EOS_ID)]
    best = None
    with torch.no_grad():
        memory = model.encode(src)
        for n in range(1, limit + 1):
            for out in itertools.product(words, repeat=n):
                target = [*out, EOS_ID]
                tgt_in = torch.tensor([[BOS_ID, *out]])
                log_probs = torch.log_softmax(model.decode(tgt_in, memory).float(), dim=-1)[0]
                total = log_probs[torch.arange(len(target)), torch.tensor(target)].sum().item()
                score = total / length_penalty(len(target), alpha, "fairseq")
                if best is None or score > best[1]:
                    best = (list(out), score)
    return best


@pytest.mark.parametrize("seed,alpha", [(2, 1.0), (3, 2.0), (5, 0.5)])
def test_fairseq_ends_find_the_exhaustive_optimum(seed, alpha):
    # 3 producible words, 1 to 3 of them before the EOS: 39 outputs, all kept by a beam of 64.
    model = _model(vocab=6, seed=seed)
    src = torch.tensor([[4, 5, 5, 4]])
    tokens, score = _exhaustive_fairseq_best(model, src, limit=3, alpha=alpha)
    settings = FAIRSEQ | {"alpha": alpha}
    [found] = _best(model, src, beam_size=64, max_len=3, **settings)
    assert (found.tokens, found.score) == (tokens, pytest.approx(score, abs=1e-5))


def test_fairseq_ends_force_and_score_the_eos_after_the_limit():
    # Three words (0.5, 0.99, 0.99) and the forced EOS (0.01): (log of their product) / 4. Ours
    # ends the same words at the limit without EOS: / 3.
    model = _scripted(first={EOS_ID: 0.5, 4: 0.5}, later={4: 0.99, EOS_ID: 0.01})
    src = torch.tensor([[4, 5]])
    words = math.log(0.5) + 2 * math.log(0.99)
    for beam in ({"beam_size": 3}, {"beam_size": 1, "greedy": True}):
        [best] = _best(model, src, max_len=3, **FAIRSEQ, **beam)
        assert best.tokens == [4, 4, 4]
        assert best.score == pytest.approx((words + math.log(0.01)) / 4, abs=1e-4)
    [ours] = _best(model, src, beam_size=3, max_len=3, length_norm="fairseq", alpha=1.0)
    assert (ours.tokens, ours.score) == ([4, 4, 4], pytest.approx(words / 3, abs=1e-4))


def test_fairseq_ends_never_return_an_empty_output():
    model = _scripted(first={EOS_ID: 0.9, 4: 0.1}, later={EOS_ID: 0.9, 4: 0.1})
    src = torch.tensor([[4, 5]])
    for beam in ({"beam_size": 4}, {"beam_size": 1, "greedy": True}):
        [best] = _best(model, src, max_len=10, **FAIRSEQ, **beam)
        assert best.tokens == [4]
        assert best.score == pytest.approx((math.log(0.1) + math.log(0.9)) / 2, abs=1e-4)
        assert best_tokens(model, src, max_len=10, **beam) == [[]]  # ours allows it


def test_fairseq_ends_allow_source_length_plus_offset_tokens_before_the_eos():
    torch.manual_seed(0)
    model = RarelyEnds(presets.debug(), 24)
    src = _sources()
    src_lens = (src != PAD_ID).sum(1).tolist()  # as fairseq's, the source's EOS among them
    for beam in ({"beam_size": 3}, {"beam_size": 1, "greedy": True}):
        outputs = best_tokens(model, src, max_len_offset=3, **FAIRSEQ, **beam)
        assert [len(o) for o in outputs] == [n + 3 for n in src_lens]
        assert all(EOS_ID not in o for o in outputs)
