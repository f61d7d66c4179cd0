"""Scoring: sacreBLEU and the paper's tokenized compound-split BLEU, kept apart."""

import math
import shutil
import subprocess
from collections import Counter

import pytest

from evaluation.bleu import (
    bleu_by_length,
    moses_tokenize,
    score_texts,
    sentence_bleu,
    split_compounds,
)


def _bleu_by_hand(hyps, refs):
    """Corpus BLEU from n-gram counts of whitespace tokens: one reference, no smoothing."""
    matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hyps, refs, strict=True):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            h_grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return (
        100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4)
    )


HYPS = ["the cat sat on the mat", "there is a dog in the garden"]
REFS = ["the cat sat on the red mat", "there is a big dog in the garden today"]


def test_identical_texts_score_100():
    texts = ["Der Vorstands-Chef sagte: „Wir wachsen.“", "Es regnet."]
    scores = score_texts(texts, texts, "de")
    assert scores["bleu_sacre"] == pytest.approx(100.0)
    assert scores["bleu_tok_compound"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["segments"] == 2


def test_sacrebleu_matches_ngram_counts():
    scores = score_texts(HYPS, REFS, "en")
    expected = _bleu_by_hand(HYPS, REFS)
    assert 0 < expected < 100
    assert scores["bleu_sacre"] == pytest.approx(expected, abs=1e-6)


def test_signatures():
    scores = score_texts(HYPS, REFS, "de")
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in scores["bleu_sacre_signature"]
    assert "version:" in scores["bleu_sacre_signature"]
    tok_sig = scores["bleu_tok_compound_signature"]
    assert "tok:none" in tok_sig and "moses-de" in tok_sig and "compound" in tok_sig
    assert tok_sig != scores["bleu_sacre_signature"]
    assert "nc:6" in scores["chrf_signature"]


def test_tokenized_compound_bleu_by_hand():
    hyp = "Der Vorstands-Chef sagte: Wir wachsen."
    ref = "Der Vorstands-Vorsitzende sagte: Wir wachsen stark."
    # Moses tokenization, then the compound split, written out by hand.
    hyp_tok = "Der Vorstands ##AT##-##AT## Chef sagte : Wir wachsen ."
    ref_tok = "Der Vorstands ##AT##-##AT## Vorsitzende sagte : Wir wachsen stark ."
    scores = score_texts([hyp], [ref], "de")
    assert scores["bleu_tok_compound"] == pytest.approx(
        _bleu_by_hand([hyp_tok], [ref_tok]), abs=1e-6
    )
    # The split gives partial credit that sacreBLEU (which keeps the compound whole) does not.
    assert scores["bleu_tok_compound"] > scores["bleu_sacre"]


def test_lowercased_tokenized_bleu_by_hand():
    # Multi30k's form: Moses tokens, case folded; compounds stay whole.
    hyp = "Ein Mann fährt Fahrrad, auf der Straße."
    ref = "ein mann fährt ein Fahrrad, auf der straße."
    hyp_tok = "ein mann fährt fahrrad , auf der straße ."
    ref_tok = "ein mann fährt ein fahrrad , auf der straße ."
    scores = score_texts([hyp], [ref], "de")
    assert scores["bleu_tok_lc"] == pytest.approx(_bleu_by_hand([hyp_tok], [ref_tok]), abs=1e-6)
    assert scores["bleu_tok_lc"] > scores["bleu_sacre"]  # case-sensitive: Mann != mann
    assert "lc" in scores["bleu_tok_lc_signature"] and "moses-de" in scores["bleu_tok_lc_signature"]


def test_tokenized_bleu_is_unsmoothed_like_multi_bleu():
    # No matching 4-gram anywhere: multi-bleu.perl reports 0; smoothed sacreBLEU does not.
    scores = score_texts(["a b c d"], ["a b x d"], "en")
    assert scores["bleu_tok_compound"] == 0.0
    assert scores["bleu_sacre"] > 0.0


def test_moses_tokenization():
    assert moses_tokenize(["Hallo, Welt!", 'Er sagte: "3.5% & mehr".'], "de") == [
        "Hallo , Welt !",
        'Er sagte : " 3.5 % & mehr " .',
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Vorstands-Chef", "Vorstands ##AT##-##AT## Chef"),
        ("der rich-text format", "der rich ##AT##-##AT## text format"),
        ("E-Mail-Adresse", "E ##AT##-##AT## Mail ##AT##-##AT## Adresse"),
        ("a-b-c", "a ##AT##-##AT## b-c"),  # non-overlapping matches, as perl s///g
        ("Berlin - Paris", "Berlin - Paris"),
        ("-5 Grad", "-5 Grad"),
        ("kein Bindestrich", "kein Bindestrich"),
    ],
)
def test_split_compounds(text, expected):
    assert split_compounds(text) == expected


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_split_compounds_equals_reference_perl():
    lines = ["E-Mail-Adresse a-b-c-d x-y", "Vorstands-Chef - -5 5- ##AT##-##AT##", "ein--zwei"]
    out = subprocess.run(
        ["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert [split_compounds(line) for line in lines] == out


def test_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        score_texts([], [], "de")
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_texts(["a", "b"], ["a"], "de")


def test_sentence_bleu_per_segment():
    scores = sentence_bleu(["a b c d", "völlig anders"], ["a b c d", "a b c d"], "de")
    assert scores[0] == pytest.approx(100.0)
    assert scores[1] == pytest.approx(0.0)


def test_bleu_by_length_buckets():
    sources = ["one two", "w " * 15, "w " * 70]
    rows = bleu_by_length(sources, HYPS + ["x"], REFS + ["x"], "en")
    assert [r["bucket"] for r in rows] == ["1-9", "10-19", "60+"]
    assert [r["segments"] for r in rows] == [1, 1, 1]
    assert rows[2]["bleu_sacre"] == pytest.approx(0.0)  # a 1-word hypothesis has no 4-grams
