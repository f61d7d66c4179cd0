"""Labeled bracket scoring with EVALB's conventions (Sekine & Collins), parameters of COLLINS.prm.

What EVALB with ``-p COLLINS.prm`` does, and so does this:
- words whose POS tag is a DELETE_LABEL (``,`` ``:`` ````` ``''`` ``.``, and ``-NONE-``) are
  removed before spans are computed; brackets are ``(label, start, end)`` over the words left;
- brackets labelled TOP are not counted, nor are brackets that cover no word once punctuation
  is gone, nor preterminals; an empty root bracket ``( (S ...) )`` or a ROOT one *is* counted,
  as EVALB counts it (trees read with ``keep_root``, as ``score_files`` does; the pipeline's own
  trees never have one);
- labels are cut at the first ``-`` or ``=`` (function tags, indices); ADVP equals PRT;
- matching is a multiset intersection per sentence; precision, recall and F1 are corpus totals
  (sum matched / sum test, sum matched / sum gold);
- a sentence whose gold and test words differ once punctuation is deleted (a length or word
  mismatch, e.g. a period tagged NN) is an error: counted, and left out of the totals; a test
  tree without words is skipped;
- MAX_ERROR 10: EVALB exits without any totals at its 12th error (``Error_count++ >
  Max_error``); ``score_corpus`` raises ``TooManyErrors`` there too. ``max_error=None`` (EVALB's
  ``-e`` with a large number) scores every sentence instead.

    python -m evaluation.evalb GOLD TEST      # EVALB's summary lines for two bracketed files
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from parsing.trees import CLOSE, LEAF, OPEN, Tree, walk

__all__ = [
    "EvalbParams",
    "COLLINS",
    "TooManyErrors",
    "score_files",
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
    max_error: int | None = 10
    """MAX_ERROR: EVALB gives up (no totals) at error number max_error + 2; None: never."""

    def canonical(self, label: str) -> str:
        """One representative per EQ_LABEL pair (PRT -> ADVP)."""
        for a, b in self.equivalent_labels:
            if label == b:
                return a
        return label


COLLINS = EvalbParams(
    # Exactly COLLINS.prm's: TOP only, so an empty or ROOT root bracket counts (as in EVALB).
    delete_labels=frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."}),
    delete_labels_for_length=frozenset({"-NONE-"}),
    equivalent_labels=(("ADVP", "PRT"),),
)


class TooManyErrors(ValueError):
    """More sentence errors than EVALB's MAX_ERROR lets through: EVALB itself prints no totals."""

    def __init__(self, errors: int, sentence: int, max_error: int) -> None:
        super().__init__(
            f"sentence {sentence} is error number {errors}: EVALB with MAX_ERROR {max_error} "
            "stops there and prints no totals (max_error=None scores every sentence)"
        )
        self.errors, self.sentence, self.max_error = errors, sentence, max_error


class _Counts(Protocol):
    """The bracket and tag counts ``_Rates`` reads (the frozen fields of its subclasses)."""

    @property
    def matched(self) -> int: ...
    @property
    def gold(self) -> int: ...
    @property
    def test(self) -> int: ...
    @property
    def words(self) -> int: ...
    @property
    def correct_tags(self) -> int: ...


class _Rates:
    """Precision, recall, F1 and tagging accuracy (percentages) from bracket and tag counts:
    one sentence's or the corpus totals alike."""

    @property
    def precision(self: _Counts) -> float:
        return _percent(self.matched, self.test)

    @property
    def recall(self: _Counts) -> float:
        return _percent(self.matched, self.gold)

    @property
    def f1(self: _Counts) -> float:
        p, r = _percent(self.matched, self.test), _percent(self.matched, self.gold)
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def tagging_accuracy(self: _Counts) -> float:
        return _percent(self.correct_tags, self.words)


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


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
        elif kind == LEAF and node.word is not None:  # a leaf always has its word
            if node.label not in params.delete_labels_for_length:
                length += 1
            if node.label not in params.delete_labels:
                words.append(node.word)
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
    """Corpus totals and per-sentence results; the two sides must have as many trees. Raises
    ``TooManyErrors`` where EVALB would give up (``params.max_error``)."""
    golds, tests = list(golds), list(tests)
    if len(golds) != len(tests):
        raise ValueError(f"{len(golds)} gold trees but {len(tests)} test trees")
    per_sentence: list[SentenceScore] = []
    errors = 0
    for i, (g, t) in enumerate(zip(golds, tests, strict=True), start=1):
        result = score_sentence(g, t, params)
        if result.status in (LENGTH_MISMATCH, WORD_MISMATCH):
            errors += 1
            if params.max_error is not None and errors > params.max_error + 1:
                raise TooManyErrors(errors, i, params.max_error)
        per_sentence.append(result)
    return summarize(per_sentence), per_sentence


def score_files(
    gold: str | Path, test: str | Path, params: EvalbParams = COLLINS
) -> tuple[CorpusScore, list[SentenceScore]]:
    """``evalb -p COLLINS.prm gold test`` on two bracketed files, root brackets kept."""
    from parsing.trees import read_trees

    return score_corpus(read_trees(gold, keep_root=True), read_trees(test, keep_root=True), params)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m evaluation.evalb GOLD TEST``: EVALB's summary for two bracketed files."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("gold")
    parser.add_argument("test")
    parser.add_argument(
        "-e", type=int, default=COLLINS.max_error, help="MAX_ERROR (default 10); -1: no limit"
    )
    args = parser.parse_args(argv)
    params = replace(COLLINS, max_error=None if args.e < 0 else args.e)
    try:
        total, scores = score_files(args.gold, args.test, params)
    except TooManyErrors as exc:
        print(exc)
        return 1
    for name, t in (("All", total), ("len<=40", summarize(scores, params.cutoff_len))):
        print(f"=== {name} ===")
        print(f"Number of sentence        = {t.sentences:6d}")
        print(f"Number of Error sentence  = {t.errors:6d}")
        print(f"Number of Skip  sentence  = {t.skipped:6d}")
        print(f"Bracketing Recall         = {t.recall:6.2f}")
        print(f"Bracketing Precision      = {t.precision:6.2f}")
        print(f"Bracketing FMeasure       = {t.f1:6.2f}")
        print(f"Complete match            = {t.exact_match:6.2f}")
        print(f"Tagging accuracy          = {t.tagging_accuracy:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
