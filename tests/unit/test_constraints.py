"""Constrained beam search for bracketed targets: every hypothesis is a well-formed tree with one
leaf per source word, whatever the model prefers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_core import EOS_ID, PAD_ID, Transformer, presets
from transformer_core.constraints import BracketState, BracketVocab, TreeConstraint
from transformer_core.search import SearchSettings, search

# A toy tree vocabulary: 4 S (opens label 0), 5 /S, 6 NP (label 1), 7 /NP, 8-11 leaves (tags);
# 12-17 source pieces that start a word, 18-23 pieces that continue one.
V = 24
S, CLOSE_S, NP, CLOSE_NP = 4, 5, 6, 7
LEAVES = range(8, 12)


def _vocab(max_depth: int = 16) -> BracketVocab:
    opens = torch.full((V,), -1)
    closes = torch.full((V,), -1)
    opens[S], closes[CLOSE_S], opens[NP], closes[CLOSE_NP] = 0, 0, 1, 1
    leaves = torch.zeros(V, dtype=torch.bool)
    leaves[list(LEAVES)] = True
    word_starts = torch.zeros(V, dtype=torch.bool)
    word_starts[12:18] = True
    return BracketVocab(opens, closes, leaves, word_starts, EOS_ID, max_depth)


def _well_formed(tokens: list[int], words: int) -> bool:
    """One root constituent, closes matching the innermost open one, no empty constituent,
    exactly ``words`` leaves, and no other token."""
    stack: list[list[int]] = []  # [label, leaves under it]
    leaves = roots = 0
    for t in tokens:
        if t in (S, NP):
            if not stack and roots:
                return False
            roots += not stack
            stack.append([t, 0])
        elif t in (CLOSE_S, CLOSE_NP):
            if not stack or stack[-1][0] != t - 1 or stack[-1][1] == 0:
                return False
            _, n = stack.pop()
            if stack:
                stack[-1][1] += n
        elif t in LEAVES:
            if not stack:
                return False
            leaves += 1
            stack[-1][1] += 1
        else:
            return False
    return not stack and roots == 1 and leaves == words


def _sources(seed: int) -> tuple[torch.Tensor, list[int]]:
    """(B, S) sources of word-start and continuation pieces, some padded; their word counts."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(12, 24, (4, 7), generator=g)
    src[:, 0] = 12  # every row starts a word
    src[1, 4:] = PAD_ID
    src[2, 2:] = PAD_ID
    src[3, -1] = EOS_ID
    words = [int(((row >= 12) & (row < 18)).sum()) for row in src]
    return src, words


def test_hand_example_allows_exactly_the_tree_continuations():
    vocab = _vocab()
    state = BracketState(vocab, torch.tensor([2]), torch.tensor([50]))

    def allowed() -> set[int]:
        return set(torch.nonzero(state.allowed()[0]).view(-1).tolist())

    assert allowed() == {S, NP}  # only a root may start
    state.advance(torch.tensor([S]))
    assert allowed() == {S, NP, *LEAVES}  # S is empty: it cannot close yet
    state.advance(torch.tensor([NP]))
    state.advance(torch.tensor([8]))
    assert allowed() == {S, NP, CLOSE_NP, *LEAVES}  # /S would close NP: only /NP matches
    state.advance(torch.tensor([CLOSE_NP]))
    assert allowed() == {S, NP, *LEAVES}  # one word left: the root may not close yet
    state.advance(torch.tensor([9]))
    assert allowed() == {CLOSE_S}  # every word has its leaf: nothing more may open
    state.advance(torch.tensor([CLOSE_S]))
    assert allowed() == {EOS_ID}  # the root is closed: only the end


def test_copy_words_writes_each_source_word_then_one_tag():
    vocab = dataclasses.replace(_vocab(), copy_words=True)
    src = torch.tensor([[12, 18, 13, EOS_ID, PAD_ID]])  # two words: 12 18, then 13
    state = BracketState(vocab, vocab.words(src), torch.tensor([50]), src=src)

    def allowed() -> set[int]:
        return set(torch.nonzero(state.allowed()[0]).view(-1).tolist())

    assert allowed() == {S, NP}
    state.advance(torch.tensor([S]))
    assert allowed() == {S, NP, 12}  # the next word's first piece, no tag, no other word
    state.advance(torch.tensor([12]))
    assert allowed() == {18}  # the rest of the word is forced
    state.advance(torch.tensor([18]))
    assert allowed() == set(LEAVES)  # then exactly one tag
    state.advance(torch.tensor([8]))
    assert allowed() == {S, NP, 13}
    state.advance(torch.tensor([13]))
    assert allowed() == set(LEAVES)
    state.advance(torch.tensor([9]))
    assert allowed() == {CLOSE_S}
    state.advance(torch.tensor([CLOSE_S]))
    assert allowed() == {EOS_ID}


def test_copy_words_scores_only_the_copied_pieces_specially():
    vocab = dataclasses.replace(_vocab(), copy_words=True)
    src = torch.tensor([[12, 18, EOS_ID]])  # one word of two pieces
    state = BracketState(vocab, vocab.words(src), torch.tensor([50]), src=src)
    log_probs = torch.log_softmax(torch.randn(1, V, generator=torch.Generator().manual_seed(0)), -1)
    labels = torch.tensor([S, CLOSE_S, NP, CLOSE_NP, EOS_ID])
    some_word = log_probs[0].index_fill(0, labels, float("-inf")).logsumexp(0)
    state.advance(torch.tensor([S]))
    masked = state.mask(log_probs.clone())[0]
    assert torch.isclose(masked[12], some_word)  # a word starts: "some word comes next"
    assert masked[NP] == log_probs[0, NP]  # labels keep the model's own score
    state.advance(torch.tensor([12]))
    assert state.mask(log_probs.clone())[0, 18] == 0.0  # the rest of the word is given
    for token in (18, 8, CLOSE_S):
        state.advance(torch.tensor([token]))
    # The tree is complete: EOS (the source's next id, too) keeps the model's own score.
    masked = state.mask(log_probs.clone())[0]
    assert masked[EOS_ID] == log_probs[0, EOS_ID] and masked.isfinite().sum() == 1


def test_copy_words_needs_the_source():
    with pytest.raises(ValueError, match="src"):
        vocab = dataclasses.replace(_vocab(), copy_words=True)
        BracketState(vocab, torch.tensor([1]), torch.tensor([9]))


def test_the_length_limit_leaves_room_to_finish():
    # 2 words and a limit of 6 tokens: S x x /S EOS fits (5); a second open would not.
    state = BracketState(_vocab(), torch.tensor([2]), torch.tensor([6]))
    state.advance(torch.tensor([S]))
    assert not bool(state.allowed()[0, NP])  # S NP x x /NP /S EOS would need 7
    assert bool(state.allowed()[0, 8])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beam", [1, 4])
def test_every_hypothesis_is_a_tree_over_the_words(seed, beam):
    torch.manual_seed(seed)
    model = Transformer(presets.debug().replace(max_len=64), V).eval()
    src, words = _sources(seed)
    settings = SearchSettings(beam_size=beam, alpha=0.3, max_len_offset=20, n_best=beam)
    found = search(model, src, settings, TreeConstraint(_vocab()))
    for hyps, n in zip(found, words, strict=True):
        assert hyps, "a constrained search always finishes"
        for h in hyps:
            assert _well_formed(h.tokens, n), h.tokens


def test_unconstrained_output_of_the_same_model_is_not_a_tree():
    # The check above could pass vacuously if the model happened to output trees anyway.
    torch.manual_seed(0)
    model = Transformer(presets.debug().replace(max_len=64), V).eval()
    src, words = _sources(0)
    found = search(model, src, SearchSettings(beam_size=4, alpha=0.3, max_len_offset=20))
    assert not all(_well_formed(h[0].tokens, n) for h, n in zip(found, words, strict=True))


def test_an_eager_eos_waits_for_the_tree():
    # A model that puts almost all mass on EOS: unconstrained it stops at once.
    class EosFirst(Transformer):
        def decode(self, tgt_in, memory, project=True):
            logits = super().decode(tgt_in, memory, project)
            logits[..., EOS_ID] += 50.0
            return logits

    torch.manual_seed(0)
    model = EosFirst(presets.debug().replace(max_len=64), V).eval()
    src, words = _sources(3)
    settings = SearchSettings(beam_size=3, alpha=0.3, use_cache=False)
    plain = search(model, src, settings)
    assert all(h[0].tokens == [] for h in plain)
    found = search(model, src, settings, TreeConstraint(_vocab()))
    assert all(_well_formed(h[0].tokens, n) for h, n in zip(found, words, strict=True))


def test_cache_and_full_recompute_agree_under_the_constraint():
    torch.manual_seed(1)
    model = Transformer(presets.debug().replace(max_len=64), V).eval()
    src, _ = _sources(1)
    cached = SearchSettings(beam_size=4, alpha=0.3)
    a = search(model, src, cached, TreeConstraint(_vocab()))
    b = search(model, src, dataclasses.replace(cached, use_cache=False), TreeConstraint(_vocab()))
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    assert [h[0].score for h in a] == pytest.approx([h[0].score for h in b], abs=1e-4)


def test_a_vocabulary_without_closing_tokens_is_refused():
    v = _vocab()
    with pytest.raises(ValueError, match="no closing token"):
        BracketVocab(v.opens, torch.full((V,), -1), v.leaves, v.word_starts, EOS_ID)


def _classed_vocab() -> BracketVocab:
    """Leaf 8 is a punctuation tag (class 1); source piece 17 is a punctuation word demanding
    it, piece 16 a word that takes any leaf; 18-23 continue a word."""
    v = _vocab()
    leaf_class = torch.zeros(V, dtype=torch.long)
    leaf_class[8] = 1
    word_class = torch.zeros(V, dtype=torch.long)
    word_class[17], word_class[16] = 1, -1
    return BracketVocab(
        v.opens,
        v.closes,
        v.leaves,
        v.word_starts,
        EOS_ID,
        leaf_class=leaf_class,
        word_class=word_class,
    )


def test_word_classes_follow_one_piece_words():
    vocab = _classed_vocab()
    # words: 12 | 17 | 17 18 (a longer word starting like a punctuation one: any leaf) | 16 |
    # 16 18 (a longer word starting like the free one: an ordinary leaf) | 13 18
    src = torch.tensor([[12, 17, 17, 18, 16, 16, 18, 13, 18, EOS_ID, PAD_ID]])
    assert vocab.word_classes(src).tolist() == [[0, 1, -1, -1, 0, 0]]


@pytest.mark.parametrize("seed", [0, 1])
def test_punctuation_words_get_their_tag_and_no_other_word_does(seed):
    torch.manual_seed(seed)
    model = Transformer(presets.debug().replace(max_len=64), V).eval()
    src = torch.tensor([[12, 17, 13, 18, 17, EOS_ID], [17, 14, 16, 15, EOS_ID, PAD_ID]])
    found = search(
        model, src, SearchSettings(beam_size=3, alpha=0.3), TreeConstraint(_classed_vocab())
    )
    expected = [[False, True, False, True], [True, False, None, False]]  # None: either
    for hyps, punct in zip(found, expected, strict=True):
        leaves = [t for t in hyps[0].tokens if t in LEAVES]
        assert len(leaves) == len(punct)
        for leaf, is_punct in zip(leaves, punct, strict=True):
            if is_punct is not None:
                assert (leaf == 8) == is_punct, hyps[0].tokens
