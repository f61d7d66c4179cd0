"""evaluation.compare: two systems on the same references, by sacreBLEU's paired bootstrap."""

from __future__ import annotations

import random

import pytest

from evaluation.bleu import score_texts
from evaluation.compare import COMPARED, compare_systems

WORDS = "the a cat dog house tree red big old new sees walks to on in".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


REFS = sentences(60, seed=0)


def damaged(texts: list[str], share: float, seed: int) -> list[str]:
    """``texts`` with a word dropped from each of a ``share`` of them."""
    rng = random.Random(seed)
    return [" ".join(t.split()[1:]) if rng.random() < share else t for t in texts]


def test_identical_systems_differ_by_nothing() -> None:
    hyps = damaged(REFS, 0.5, seed=1)
    rows = compare_systems(REFS, hyps, list(hyps), "en")
    assert [r.metric for r in rows] == list(COMPARED)
    for row in rows:
        assert row.difference == 0 and row.low == row.high == 0
        assert row.p_value == 1.0
        assert row.a == row.b
        assert "bs:1000" in row.signature and "seed:12345" in row.signature


def test_a_clearly_better_system_has_a_small_p_and_an_interval_above_zero() -> None:
    better, worse = damaged(REFS, 0.1, seed=1), damaged(REFS, 0.9, seed=2)
    # bleu_tok_lc too: a lowercasing recipe's deciding metric (not in the table's COMPARED).
    compared = compare_systems(REFS, better, worse, "en", metrics=[*COMPARED, "bleu_tok_lc"])
    rows = {r.metric: r for r in compared}
    assert len(rows) == 4
    direct_a, direct_b = score_texts(better, REFS, "en"), score_texts(worse, REFS, "en")
    for name, row in rows.items():
        # Each figure is the score stage's.
        assert row.a == pytest.approx(direct_a[name]) and row.b == pytest.approx(direct_b[name])
        assert row.difference == pytest.approx(direct_a[name] - direct_b[name])
        assert row.difference > 0 and 0 < row.low <= row.difference <= row.high
        assert row.p_value < 0.01
    # The other way round: the same difference, negated, and as significant.
    back = {r.metric: r for r in compare_systems(REFS, worse, better, "en")}
    assert back["bleu_sacre"].difference == pytest.approx(-rows["bleu_sacre"].difference)
    assert back["bleu_sacre"].high < 0 and back["bleu_sacre"].p_value < 0.01


def test_close_systems_are_not_significant_and_reruns_print_the_same() -> None:
    a = damaged(REFS, 0.3, seed=1)
    b = [REFS[0], *a[1:3], damaged(a[3:4], 1.0, seed=3)[0], *a[4:]]  # one line better, one worse
    first = compare_systems(REFS, a, b, "en", metrics=["bleu_sacre"])
    assert first == compare_systems(REFS, a, b, "en", metrics=["bleu_sacre"])
    (row,) = first
    assert row.low < 0 < row.high  # the interval holds no difference at all
    assert row.p_value > 0.05


def test_misaligned_or_empty_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="60 references, 59 and 60 hypotheses"):
        compare_systems(REFS, REFS[:-1], REFS, "en")
    with pytest.raises(ValueError, match="empty test set"):
        compare_systems([], [], [], "en")
    with pytest.raises(ValueError, match="cannot compare on \\['ter'\\]"):
        compare_systems(REFS, REFS, REFS, "en", metrics=["ter"])
