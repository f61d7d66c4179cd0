"""EVALB-convention scoring on hand-computed examples, and the parse_score stage."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evaluation.evalb import (
    COLLINS,
    TooManyErrors,
    score_corpus,
    score_files,
    score_sentence,
    summarize,
)
from parsing.linearize import linearize
from parsing.trees import Tree, parse_tree, write_tree
from tasks.framework.config import config_from_dict
from tasks.framework.results import StageError
from tasks.framework.runner import build_folder, run_stage

PARSING_DATA = {"source": "treebank", "pair": "words-tree"}
"""The data section of a parsing config: its pipeline is the one that runs these stages."""

# Words: The cat sat on the mat .   The period is deleted, leaving positions 0..6 over 6 words.
# Gold brackets: S(0,6) NP(0,2) VP(2,6) PP(3,6) NP(4,6) -> 5 (preterminals are not brackets).
GOLD = parse_tree(
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"
)
# The PP is missing: S NP VP NP(4,6) -> 4 brackets, all in gold.
MISSING_PP = parse_tree(
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (IN on) (NP (DT the) (NN mat))) (. .))"
)
# PP(3,6) labelled ADJP: 5 brackets, 4 match.
WRONG_LABEL = parse_tree(
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (ADJP (IN on) (NP (DT the) (NN mat)))) (. .))"
)


def test_identical_trees_score_100():
    s = score_sentence(GOLD, GOLD)
    assert (s.matched, s.gold, s.test) == (5, 5, 5)
    assert (s.precision, s.recall, s.f1, s.tagging_accuracy) == (100.0, 100.0, 100.0, 100.0)
    assert s.exact and s.words == 6  # the period is not scored


def test_a_missing_bracket():
    s = score_sentence(GOLD, MISSING_PP)
    # P = 4/4 = 100, R = 4/5 = 80, F1 = 2*100*80/(100+80) = 16000/180 = 88.888...
    assert (s.matched, s.gold, s.test) == (4, 5, 4)
    assert s.precision == 100.0 and s.recall == 80.0
    assert s.f1 == pytest.approx(88.8889, abs=1e-4)
    assert not s.exact


def test_a_wrong_label():
    s = score_sentence(GOLD, WRONG_LABEL)
    # P = 4/5 = 80, R = 4/5 = 80, F1 = 80
    assert (s.matched, s.gold, s.test) == (4, 5, 5)
    assert (s.precision, s.recall, s.f1) == (80.0, 80.0, 80.0)


def test_corpus_totals_are_sums_not_averages():
    total, per = score_corpus([GOLD, GOLD], [MISSING_PP, WRONG_LABEL])
    # matched 4+4 = 8, gold 5+5 = 10, test 4+5 = 9: P = 8/9 = 88.89, R = 8/10 = 80,
    # F1 = 2*(8/9)*(8/10) / (8/9 + 8/10) = (128/90) / (152/90) = 128/152 = 84.2105...
    # (the mean of the sentence F1s would be (88.89 + 80) / 2 = 84.44)
    assert (total.matched, total.gold, total.test) == (8, 10, 9)
    assert total.precision == pytest.approx(800 / 9)
    assert total.recall == pytest.approx(80.0)
    assert total.f1 == pytest.approx(84.2105, abs=1e-4)
    assert total.exact_match == 0.0 and [s.f1 for s in per] == pytest.approx(
        [88.8889, 80.0], abs=1e-4
    )


def test_punctuation_is_deleted_before_spans():
    # The period attached inside the VP, and a bracket over nothing but punctuation: after
    # deletion the VP still spans (2,6) and X spans (6,6), which is not counted. 5/5 matched.
    test = parse_tree(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat))) (X (. .))))"
    )
    s = score_sentence(GOLD, test)
    assert (s.matched, s.gold, s.test, s.f1) == (5, 5, 5, 100.0)


def test_every_collins_punctuation_tag_is_deleted():
    # , : `` '' . are deleted: 2 words left (Yes, no). Gold: S(0,2) INTJ(0,1) -> 2 brackets.
    gold = parse_tree("(S (`` ``) (INTJ (UH Yes)) (, ,) (: ;) (NP (DT no)) ('' '') (. .))")
    # Test joins "Yes ," under INTJ and the quotes into NP: same spans once punctuation is gone.
    test = parse_tree("(S (`` ``) (INTJ (UH Yes) (, ,)) (: ;) (NP (DT no) ('' '') (. .)))")
    s = score_sentence(gold, test)
    # gold brackets: S(0,2) INTJ(0,1) NP(1,2) = 3; test the same 3
    assert (s.matched, s.gold, s.test, s.words) == (3, 3, 3, 2)


def test_advp_equals_prt():
    # He gave up .  ->  S(0,3) NP(0,1) VP(1,3) PRT(2,3)
    gold = parse_tree("(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))) (. .))")
    as_advp = parse_tree("(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))) (. .))")
    as_adjp = parse_tree("(S (NP (PRP He)) (VP (VBD gave) (ADJP (RP up))) (. .))")
    assert score_sentence(gold, as_advp).f1 == 100.0  # 4/4 matched
    # ADJP is not PRT: 3 of 4 match, P = R = F1 = 75
    assert score_sentence(gold, as_adjp).f1 == 75.0


def test_function_tags_are_cut_and_a_top_root_is_ignored():
    # EVALB cuts labels at - and =; TOP (COLLINS.prm's DELETE_LABEL) is not a bracket.
    test = Tree("TOP", (parse_tree("(S (NP-SBJ (DT The) (NN cat)) (VP=2 (VBD sat) (PP-LOC (IN on) "
                                   "(NP (DT the) (NN mat)))) (. .))"),))  # fmt: skip
    s = score_sentence(GOLD, test)
    assert (s.matched, s.gold, s.test) == (5, 5, 5)


def test_an_empty_or_root_bracket_counts_as_evalb_counts_it(tmp_path):
    # Real EVALB (COLLINS.prm) on these files: sentence 1 matched 3, gold 4 (the empty root
    # bracket is one), test 3; sentence 2 4/4/4 (ROOT on both sides); recall 87.50, precision 100.
    body = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    gold = tmp_path / "gold"
    test = tmp_path / "test"
    gold.write_text(f"( {body})\n(ROOT {body})\n")
    test.write_text(f"{body}\n(ROOT {body})\n")
    total, per = score_files(gold, test)
    assert [(s.matched, s.gold, s.test) for s in per] == [(3, 4, 3), (4, 4, 4)]
    assert (round(total.recall, 2), round(total.precision, 2)) == (87.5, 100.0)
    # The pipeline's reader drops root brackets (its cleaned trees never have one).
    assert parse_tree(f"( {body})") == parse_tree(body)
    assert parse_tree(f"( {body})", keep_root=True).label == ""


@pytest.mark.parametrize(("errors", "gives_up"), [(11, False), (12, True)])
def test_evalb_gives_up_at_its_twelfth_error(errors, gives_up):
    # EVALB -p COLLINS.prm (MAX_ERROR 10) printed totals with 11 length errors among 13
    # sentences and exited with status 1, printing none, with 12 among 14.
    mistagged = parse_tree("(S (NP (DT The) (NN cat)) (VP (VBD sat)) (NN .))")
    ok = parse_tree("(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))")
    golds = [ok] * (errors + 2)
    tests = [mistagged] * errors + [ok, ok]
    if gives_up:
        with pytest.raises(TooManyErrors, match="sentence 12 is error number 12"):
            score_corpus(golds, tests)
    else:
        assert score_corpus(golds, tests)[0].errors == errors
    unlimited = dataclasses.replace(COLLINS, max_error=None)
    assert score_corpus(golds, tests, unlimited)[0].errors == errors


def test_brackets_are_a_multiset():
    # gold S(0,1) VP(0,1); test S(0,1) S(0,1) VP(0,1): 2 of 3 test brackets match.
    # P = 2/3, R = 2/2, F1 = 2*(2/3)*1/(2/3 + 1) = (4/3)/(5/3) = 80
    gold = parse_tree("(S (VP (VB Go)))")
    test = parse_tree("(S (S (VP (VB Go))))")
    s = score_sentence(gold, test)
    assert (s.matched, s.gold, s.test) == (2, 2, 3)
    assert s.f1 == pytest.approx(80.0)


def test_tagging_accuracy_over_non_punctuation_words():
    test = parse_tree(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (RB on) (NP (DT the) (NN mat)))) (. .))"
    )
    s = score_sentence(GOLD, test)
    # 5 of the 6 scored words have the gold tag (on: IN vs RB): 83.33; brackets still 5/5
    assert (s.words, s.correct_tags) == (6, 5)
    assert s.tagging_accuracy == pytest.approx(500 / 6)
    assert s.f1 == 100.0


def test_length_mismatch_is_an_error_left_out_of_the_totals():
    # The period tagged NN is not deleted in the test tree: 7 words against 6.
    mistagged = parse_tree(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (NN .))"
    )
    total, per = score_corpus([GOLD, GOLD], [mistagged, MISSING_PP])
    assert per[0].status == "length mismatch" and not per[0].valid
    assert (total.sentences, total.errors, total.valid) == (2, 1, 1)
    # totals are the second sentence alone: 4 matched, 5 gold, 4 test
    assert (total.matched, total.gold, total.test) == (4, 5, 4)


def test_exact_match_and_length_cutoff():
    long_gold = parse_tree("(S " + " ".join(f"(NN w{i})" for i in range(41)) + ")")
    total, per = score_corpus([GOLD, GOLD, long_gold], [GOLD, WRONG_LABEL, long_gold])
    assert total.exact == 2 and total.exact_match == pytest.approx(200 / 3)
    assert [s.length for s in per] == [7, 7, 41]  # the length counts punctuation
    short = summarize(per, max_len=40)
    assert short.sentences == 2 and short.exact == 1


# ----------------------------------------------------------------------------- the stage


def _artifact(path, stage, files):
    def build(tmp):
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")

    return build_folder(stage, path, {"files": sorted(files)}, {}, build).path


@pytest.fixture
def scored(tmp_path):
    golds = [GOLD, parse_tree("(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))) (. .))")]
    linearized = _artifact(
        tmp_path / "run" / "linearize",
        "linearize",
        {
            "gold.trees": "".join(write_tree(t) + "\n" for t in golds),
            "test.words": "".join(" ".join(t.words()) + "\n" for t in golds),
        },
    )
    # sentence 1 decoded without its PP; sentence 2 decoded with the closing brackets cut off
    hyps = " ".join(linearize(MISSING_PP)) + "\n" + "S NP PRP /NP VP VBD ADVP RP\n"
    translated = _artifact(tmp_path / "run" / "translate", "translate", {"hyp.tree": hyps})
    config = config_from_dict({"name": "p", "workdir": str(tmp_path / "run"), "data": PARSING_DATA})
    return config, {"translate": translated, "linearize": linearized}


def test_parse_score_stage(scored, tmp_path):
    config, inputs = scored
    out = run_stage(config, "parse_score", inputs).path
    scores = json.loads((out / "scores.json").read_text())
    # sentence 1: 4/5 gold, 4/4 test. Sentence 2 repaired (no slot for '.', which joins the
    # innermost open ADVP with its punctuation tag; 3 unclosed) into
    # (S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up) (. .)))): 4/4, ADVP = PRT.
    # totals: matched 8, gold 9, test 8 -> P 100, R 88.89, F1 = 2*100*88.89/188.89 = 94.1176
    assert scores["f1"] == pytest.approx(94.1176, abs=1e-4)
    assert (scores["precision"], scores["sentences"], scores["length_errors"]) == (100.0, 2, 0)
    assert scores["exact_match"] == 50.0 and scores["repaired_sentences"] == 1
    assert scores["fixes"] == {"missing_leaves": 1, "unclosed": 3}
    rows = [line.split("\t") for line in (out / "sentences.tsv").read_text().splitlines()]
    assert rows[0][:6] == ["id", "length", "status", "matched", "gold", "test"]
    assert rows[1][:6] == ["1", "7", "ok", "4", "5", "4"]
    assert rows[2][-1] == "missing_leaves=1,unclosed=3"
    repaired = (out / "repaired.trees").read_text().splitlines()
    assert repaired[1] == "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up) (. .))))"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["f1"] == scores["f1"]


def test_parse_score_gives_up_where_evalb_does(tmp_path):
    gold = parse_tree("(S (NP (PRP He)) (VP (VBD left)) (. .))")
    n = 12
    linearized = _artifact(
        tmp_path / "run" / "linearize",
        "linearize",
        {"gold.trees": f"{write_tree(gold)}\n" * n, "test.words": "He left Wa\n" * n},
    )
    # "Wa" is not punctuation, so repair cannot tag it ".": every sentence is a length error.
    hyps = "S NP PRP /NP VP VBD /VP . /S\n" * n
    translated = _artifact(tmp_path / "run" / "translate", "translate", {"hyp.tree": hyps})
    inputs = {"translate": translated, "linearize": linearized}
    config = config_from_dict({"name": "p", "workdir": str(tmp_path / "run"), "data": PARSING_DATA})
    with pytest.raises(StageError, match="error number 12.*evalb_max_error: null"):
        run_stage(config, "parse_score", inputs)
    config = config_from_dict(
        {
            "name": "p",
            "workdir": str(tmp_path / "run"),
            "data": PARSING_DATA,
            "parsing": {"evalb_max_error": None},
        }
    )
    assert run_stage(config, "parse_score", inputs).stats["length_errors"] == n


def test_parse_score_needs_one_hypothesis_per_gold_tree(scored, tmp_path):
    config, inputs = scored
    inputs["translate"] = _artifact(
        tmp_path / "other" / "translate", "translate", {"hyp.tree": "S NP PRP /NP /S\n"}
    )
    with pytest.raises(StageError, match="has 1 lines but .* has 2 trees"):
        run_stage(config, "parse_score", inputs)
    assert not (tmp_path / "run" / "parse_score").exists()


# ----------------------------------------------------------------------------- against real EVALB

_LONG_NP = " ".join(f"(NN w{i})" for i in range(21))
_LONG_VP = " ".join(f"(VB w{i})" for i in range(21, 41))
_LONG_FLAT = " ".join(f"(NN w{i})" for i in range(41))
EVALB_GOLD = [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))) (. .))",
    "(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (DT a) (NN shop))) (, ,) "
    "(NP (NNS people)) (VP (VBP say)) (. .))",
    "(S (NP (DT The) (JJ old) (NN man)) "
    "(VP (VBD said) (SBAR (IN that) (S (NP (PRP it)) (VP (VBD rained))))) (. .))",
    "(S (`` ``) (NP (PRP We)) (VP (VBP win) (ADVP (RB again))) ('' '') (. .))",
    "(S (NP (DT the) (NN dog)) (VP (VBD barked) (PP (IN at) (NP (NN night)))) (. .))",
    f"(S (NP {_LONG_NP}) (VP {_LONG_VP}))",
]
EVALB_TEST = [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))) (. .))",
    "(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (DT a) (NN shop)) (, ,) "
    "(NP (NNS people))) (VP (VBP say)) (. .))",
    "(S (NP (DT The) (NN old) (NN man)) "
    "(VP (VBD said) (SBAR (IN that) (S (NP (PRP it)) (VP (VBD rained))))) (. .))",
    "(S (`` ``) (NP (PRP We)) (VP (VBP win) (NP (RB again)) ('' '')) (. .))",
    "(S (NP (DT the) (NN dog)) (VP (VBD barked) (IN at) (NN night)) (. .))",
    f"(S (NP {_LONG_FLAT}))",
]
# `evalb -p COLLINS.prm gold test` (EVALB 20080701, built from its C source) on the two lists
# above, one tree per line. Per sentence: length, matched, gold, test brackets, words, correct tags.
EVALB_SENTENCES = [
    (7, 5, 5, 5, 6, 6),
    (4, 4, 4, 4, 3, 3),
    (9, 5, 6, 6, 7, 7),
    (8, 7, 7, 7, 7, 6),
    (6, 3, 4, 4, 3, 3),
    (6, 3, 5, 3, 5, 5),
    (41, 1, 3, 2, 41, 21),
]
EVALB_ALL = {
    "recall": 82.35,
    "precision": 90.32,
    "f1": 86.15,
    "exact_match": 42.86,
    "tagging_accuracy": 70.83,
}
EVALB_LE40_F1 = 90.00


def test_parse_score_stage_reproduces_real_evalb(tmp_path):
    golds = [parse_tree(t) for t in EVALB_GOLD]
    tests = [parse_tree(t) for t in EVALB_TEST]
    linearized = _artifact(
        tmp_path / "run" / "linearize",
        "linearize",
        {
            "gold.trees": "".join(write_tree(t) + "\n" for t in golds),
            "test.words": "".join(" ".join(t.words()) + "\n" for t in golds),
        },
    )
    hyps = "".join(" ".join(linearize(t)) + "\n" for t in tests)
    translated = _artifact(tmp_path / "run" / "translate", "translate", {"hyp.tree": hyps})
    config = config_from_dict({"name": "p", "workdir": str(tmp_path / "run"), "data": PARSING_DATA})
    result = run_stage(config, "parse_score", {"translate": translated, "linearize": linearized})

    stats = result.stats
    assert (stats["sentences"], stats["length_errors"], stats["skipped_sentences"]) == (7, 0, 0)
    assert (stats["matched_brackets"], stats["gold_brackets"], stats["test_brackets"]) == (
        28,
        34,
        31,
    )
    for key, value in EVALB_ALL.items():
        assert round(stats[key], 2) == value, key
    assert round(stats["f1_le40"], 2) == EVALB_LE40_F1
    rows = [
        line.split("\t") for line in (result.path / "sentences.tsv").read_text().splitlines()[1:]
    ]
    got = [(int(r[1]), int(r[3]), int(r[4]), int(r[5]), int(r[9]), int(r[10])) for r in rows]
    assert got == EVALB_SENTENCES
    assert stats["repaired_sentences"] == 0  # well-formed hypotheses need no repair
