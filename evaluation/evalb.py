"""Labeled bracket scoring with EVALB's conventions (Sekine & Collins), parameters of COLLINS.prm.

What EVALB with ``-p COLLINS.prm`` does, and so does this:
- words whose POS tag is a DELETE_LABEL (``,`` ``:`` ````` ``''`` ``.``, and ``-NONE-``) are
  removed before spans are computed; brackets are ``(label, start, end)`` over the words left;
- brackets labelled TOP (here also the empty root bracket and ROOT) are not counted, nor are
  brackets that cover no word once punctuation is gone, nor preterminals;
- labels are cut at the first ``-`` or ``=`` (function tags, indices); ADVP equals PRT;
- matching is a multiset intersection per sentence; precision, recall and F1 are corpus totals
  (sum matched / sum test, sum matched / sum gold);
- a sentence whose gold and test words differ once punctuation is deleted (a length or word
  mismatch, e.g. a period tagged NN) is an error: counted, and left out of the totals; a test
  tree without words is skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parsing.trees import CLOSE, LEAF, OPEN, Tree, walk

__all__ = [
    "EvalbParams",
    "COLLINS",
    "SentenceScore",
    "CorpusScore",
    "score_sentence",
    "score_corpus",
    "summarize",
]

OK, LENGTH_MISMATCH, WORD_MISMATCH, SKIPPED = "ok", "length mismatch", "word mismatch", "skipped"
_CUT = re.compile(r"[-=]")


@dataclass(frozen=True)
class EvalbParams:
    """The parts of an EVALB parameter file that matter here."""

    delete_labels: frozenset[str]
    """DELETE_LABEL: brackets with these labels are ignored, words with these tags deleted."""
    delete_labels_for_length: frozenset[str]
    """DELETE_LABEL_FOR_LENGTH: tags not counted in a sentence's length (for the cutoff)."""
    equivalent_labels: tuple[tuple[str, str], ...]
    """EQ_LABEL pairs, considered the same label."""
    cutoff_len: int = 40
    """CUTOFF_LEN: the length bound of EVALB's second summary."""

    def canonical(self, label: str) -> str:
        """One representative per EQ_LABEL pair (PRT -> ADVP)."""
        for a, b in self.equivalent_labels:
            if label == b:
                return a
        return label


COLLINS = EvalbParams(
    # TOP as in COLLINS.prm; "" (PTB's empty root bracket) and ROOT mean the same here.
    delete_labels=frozenset({"TOP", "", "ROOT", "-NONE-", ",", ":", "``", "''", "."}),
    delete_labels_for_length=frozenset({"-NONE-"}),
    equivalent_labels=(("ADVP", "PRT"),),
)


class _Rates:
    """Precision, recall, F1 and tagging accuracy (percentages) from bracket and tag counts:
    one sentence's or the corpus totals alike."""

    matched: int
    gold: int
    test: int
    words: int
    correct_tags: int

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0


@dataclass(frozen=True)
class SentenceScore(_Rates):
    """One sentence: EVALB's per-line result."""

    length: int
    """Words, less DELETE_LABEL_FOR_LENGTH ones (what the cutoff compares)."""
    status: str
    """ok, length mismatch, word mismatch (both errors), or skipped (test tree without words)."""
    matched: int = 0
    """Brackets in both (multiset intersection)."""
    gold: int = 0
    """Gold brackets counted."""
    test: int = 0
    """Test brackets counted."""
    words: int = 0
    """Words scored for tagging (punctuation deleted)."""
    correct_tags: int = 0
    """Words whose test tag equals the gold tag."""

    @property
    def valid(self) -> bool:
        return self.status == OK

    @property
    def exact(self) -> bool:
        """EVALB's complete match: as many gold as test brackets, all matched."""
        return self.valid and self.gold == self.test == self.matched


@dataclass(frozen=True)
class CorpusScore(_Rates):
    """Corpus totals, as EVALB's summary."""

    sentences: int
    """All sentences."""
    errors: int
    """Length or word mismatches (left out of the totals)."""
    skipped: int
    """Test trees without words (left out of the totals)."""
    matched: int
    gold: int
    test: int
    exact: int
    """Valid sentences with a complete match."""
    words: int
    correct_tags: int

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def exact_match(self) -> float:
        return 100.0 * self.exact / self.valid if self.valid else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers (percentages rounded to 4 places) for JSON and MLflow."""
        return {
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
            "exact_match": round(self.exact_match, 4),
            "tagging_accuracy": round(self.tagging_accuracy, 4),
            "sentences": self.sentences,
            "valid_sentences": self.valid,
            "length_errors": self.errors,
            "skipped_sentences": self.skipped,
            "matched_brackets": self.matched,
            "gold_brackets": self.gold,
            "test_brackets": self.test,
        }


def _spans(
    tree: Tree, params: EvalbParams
) -> tuple[Counter[tuple[str, int, int]], list[str], list[str], int]:
    """(bracket multiset, words kept, their tags, length) of one tree."""
    brackets: Counter[tuple[str, int, int]] = Counter()
    words: list[str] = []
    tags: list[str] = []
    length = 0
    starts: list[int] = []
    for kind, node in walk(tree):
        if kind == OPEN:
            starts.append(len(words))
        elif kind == LEAF:
            if node.label not in params.delete_labels_for_length:
                length += 1
            if node.label not in params.delete_labels:
                words.append(node.word)  # type: ignore[arg-type]
                tags.append(node.label)
        elif kind == CLOSE:
            start, end = starts.pop(), len(words)
            label = _CUT.split(node.label, maxsplit=1)[0]
            if start == end or label in params.delete_labels:
                continue  # a zero-width bracket, or TOP
            brackets[(params.canonical(label), start, end)] += 1
    return brackets, words, tags, length


def score_sentence(gold: Tree, test: Tree, params: EvalbParams = COLLINS) -> SentenceScore:
    """EVALB's result for one sentence."""
    gold_brackets, gold_words, gold_tags, length = _spans(gold, params)
    test_brackets, test_words, test_tags, _ = _spans(test, params)
    if not test_words:
        return SentenceScore(length, SKIPPED)
    if len(gold_words) != len(test_words):
        return SentenceScore(length, LENGTH_MISMATCH)
    if gold_words != test_words:
        return SentenceScore(length, WORD_MISMATCH)
    correct = sum(
        params.canonical(g) == params.canonical(t)
        for g, t in zip(gold_tags, test_tags, strict=True)
    )
    return SentenceScore(
        length,
        OK,
        matched=sum((gold_brackets & test_brackets).values()),
        gold=sum(gold_brackets.values()),
        test=sum(test_brackets.values()),
        words=len(gold_words),
        correct_tags=correct,
    )


def summarize(scores: Iterable[SentenceScore], max_len: int | None = None) -> CorpusScore:
    """Corpus totals over sentences (of at most ``max_len`` words when given)."""
    picked = [s for s in scores if max_len is None or s.length <= max_len]
    valid = [s for s in picked if s.valid]
    return CorpusScore(
        sentences=len(picked),
        errors=sum(s.status in (LENGTH_MISMATCH, WORD_MISMATCH) for s in picked),
        skipped=sum(s.status == SKIPPED for s in picked),
        matched=sum(s.matched for s in valid),
        gold=sum(s.gold for s in valid),
        test=sum(s.test for s in valid),
        exact=sum(s.exact for s in valid),
        words=sum(s.words for s in valid),
        correct_tags=sum(s.correct_tags for s in valid),
    )


def score_corpus(
    golds: Iterable[Tree], tests: Iterable[Tree], params: EvalbParams = COLLINS
) -> tuple[CorpusScore, list[SentenceScore]]:
    """Corpus totals and per-sentence results; the two sides must have as many trees."""
    golds, tests = list(golds), list(tests)
    if len(golds) != len(tests):
        raise ValueError(f"{len(golds)} gold trees but {len(tests)} test trees")
    per_sentence: Sequence[SentenceScore] = [
        score_sentence(g, t, params) for g, t in zip(golds, tests, strict=True)
    ]
    return summarize(per_sentence), list(per_sentence)
