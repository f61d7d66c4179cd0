"""Linearized forms, repair back to trees, and the linearize stage."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from evaluation.evalb import score_corpus
from parsing.linearize import FORMS, linearize, punctuation_tag, repair, source, structure_tokens
from parsing.trees import parse_tree, read_trees, write_tree
from tasks.framework.config import config_from_dict
from tasks.framework.runner import build_folder, run_stage

PARSING_DATA = {"source": "treebank", "pair": "words-tree"}
"""The data section of a parsing config: its pipeline is the one that runs these stages."""

JOHN = parse_tree("(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (DT a) (NN shop))) (. .))")

# A small .mrg treebank: function tags, indices, traces and -NONE-, punctuation of every EVALB
# kind, PRT, brackets, a unary chain, and a root bracket over two constituents.
MRG = """\
( (S
    (NP-SBJ-1 (NNP Pierre) (NNP Vinken) )
    (, ,)
    (VP (MD will)
      (VP (VB join)
        (NP (DT the) (NN board) )
        (PP-CLR (IN as)
          (NP (DT a) (JJ nonexecutive) (NN director) ))
        (NP-TMP (NNP Nov.) (CD 29) )))
    (. .) ))
( (S
    (`` ``)
    (NP-SBJ (PRP He) )
    (VP (VBD gave)
      (PRT (RP up) )
      (SBAR (-NONE- 0) (S (-NONE- *T*-1) ))
      (PP-LOC=2 (IN in)
        (NP (-LRB- -LRB-) (NNP Paris) (-RRB- -RRB-) )))
    ('' '') (: ;) (NP-SBJ (-NONE- *-1) )
    (. .) ))
( (SINV (VP (VBD said) ) (NP-SBJ (NNP Smith) ) (. .) ))
( (FRAG (NP (NN Stock) (NNS prices) ) (: --) (ADVP (RB down) ) ) )
( (S (VP (VB Go) ) ) (. !) )
"""


@pytest.fixture
def trees(tmp_path):
    path = tmp_path / "sample.mrg"
    path.write_text(MRG, encoding="utf-8")
    return list(read_trees(path, clean=True))


def test_t2t_form_keeps_tags_and_labels_closing_brackets():
    assert " ".join(linearize(JOHN, "t2t")) == "S NP NNP NNP /NP VP VBZ NP DT NN /NP /VP . /S"


def test_vinyals_form_replaces_tags_with_xx():
    assert " ".join(linearize(JOHN, "vinyals")) == "(S (NP XX XX )NP (VP XX (NP XX XX )NP )VP XX )S"


def test_words_form_writes_each_word_before_its_tag():
    target = "(S (NP John NNP Smith NNP )NP (VP runs VBZ (NP a DT shop NN )NP )VP . . )S"
    assert " ".join(linearize(JOHN, "words")) == target
    assert structure_tokens(target, "words") == (
        "(S (NP NNP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S".split()
    )


def test_words_form_reads_words_that_look_like_tags():
    # A word is read where the next word is due, whatever it looks like ("NN", ".").
    tree = parse_tree("(S (NP (NNP S) (NN NN)) (. .))")
    target = linearize(tree, "words")
    assert target == ["(S", "(NP", "S", "NNP", "NN", "NN", ")NP", ".", ".", ")S"]
    assert structure_tokens(" ".join(target), "words") == [
        "(S", "(NP", "NNP", "NN", ")NP", ".", ")S"
    ]  # fmt: skip
    fixed = repair(target, tree.words(), "words")
    assert fixed.tree == tree and not fixed.fixes


def test_source_is_the_words():
    assert source(JOHN) == "John Smith runs a shop ."


def test_unknown_form_is_an_error():
    with pytest.raises(ValueError, match="unknown form"):
        linearize(JOHN, "penn")


@pytest.mark.parametrize("form", FORMS)
def test_round_trip_of_a_small_treebank_scores_100(trees, form):
    assert len(trees) == 5
    back = []
    for tree in trees:
        tags = tree.tags() if form == "vinyals" else None
        repaired = repair(linearize(tree, form), tree.words(), form, tags=tags)
        assert repaired.fixes == {}
        back.append(repaired.tree)
    assert back == trees
    total, per_sentence = score_corpus(trees, back)
    assert (total.f1, total.exact_match, total.tagging_accuracy) == (100.0, 100.0, 100.0)
    assert total.errors == 0 and all(s.f1 == 100.0 for s in per_sentence)


def test_vinyals_without_tags_gives_xx_leaves():
    tree = repair("(S (NP XX XX )NP (VP XX )VP XX )S", "John Smith runs .", "vinyals").tree
    assert tree.tags() == ["XX"] * 4
    assert write_tree(tree) == "(S (NP (XX John) (XX Smith)) (VP (XX runs)) (XX .))"


# ----------------------------------------------------------------------------- repair


def _well_formed(tree, words):
    """Exactly the words as leaves, and the bracketed text reads back as the same tree."""
    assert tree.words() == list(words)
    assert parse_tree(write_tree(tree)) == tree


def test_missing_closes_are_appended():
    words = JOHN.words()
    fixed = repair("S NP NNP NNP /NP VP VBZ NP DT NN .", words)
    _well_formed(fixed.tree, words)
    # NP, VP and S were open at the end: closed in that order, '.' stays in the innermost NP.
    assert write_tree(fixed.tree) == (
        "(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (DT a) (NN shop) (. .))))"
    )
    assert fixes_of(fixed) == {"unclosed": 3}


def test_stray_closes_are_dropped():
    # /NP /S before anything is open, and /S /PP after the root closed, close nothing.
    fixed = repair("/NP /S S NP NNP NNP /NP VP VBZ NP DT NN /NP /VP . /S /S /PP", JOHN.words())
    assert fixed.tree == JOHN
    assert fixes_of(fixed) == {"stray_close": 4}


def test_mislabelled_close_closes_the_innermost_open_constituent():
    fixed = repair("S NP NNP NNP /VP VP VBZ NP DT NN /S /VP . /NP", JOHN.words())
    assert fixed.tree == JOHN  # every close closed the innermost one, whatever its label
    assert fixes_of(fixed) == {"label_mismatch": 3}


def test_too_few_pos_slots_attach_the_rest_to_the_last_open_constituent():
    # Only 3 slots for 6 words; VP and NP are open at the end.
    fixed = repair("S NP NNP NNP /NP VP VBZ NP", JOHN.words())
    _well_formed(fixed.tree, JOHN.words())
    assert write_tree(fixed.tree) == (
        "(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (NN a) (NN shop) (. .))))"
    )
    assert fixed.fixes["missing_leaves"] == 3


def test_too_few_pos_slots_after_everything_closed_go_to_the_root():
    fixed = repair("S NP NNP NNP /NP /S", JOHN.words())
    _well_formed(fixed.tree, JOHN.words())
    assert write_tree(fixed.tree) == (
        "(S (NP (NNP John) (NNP Smith)) (NN runs) (NN a) (NN shop) (. .))"
    )


def test_too_many_pos_slots_are_dropped():
    fixed = repair("S NP NNP NNP NNP NNP /NP VP VBZ NP DT NN /NP /VP . . . /S", JOHN.words())
    _well_formed(fixed.tree, JOHN.words())
    assert fixed.fixes["extra_leaves"] == 4
    # The sixth slot (DT) lands on ".": the word decides its punctuation tag.
    assert fixed.tree.tags() == ["NNP", "NNP", "NNP", "NNP", "VBZ", "."]
    assert fixed.fixes["punct_tag"] == 1


def test_tags_that_contradict_punctuation_are_replaced_so_evalb_can_score():
    # Slots shifted by one: "Smith" gets ":" and "." gets NN. EVALB deletes words by their own
    # tree's tags, so without the fix the lengths differ and the sentence is not scored at all.
    fixed = repair("S NP NNP : /NP VP VBZ NP DT NN /NP /VP NN /S", JOHN.words())
    assert fixed.tree.tags() == ["NNP", "NN", "VBZ", "DT", "NN", "."]
    assert fixed.fixes["punct_tag"] == 2
    total, (sentence,) = score_corpus([JOHN], [fixed.tree])
    assert sentence.status == "ok" and total.errors == 0
    assert total.f1 == 100 and total.correct_tags == 4  # the brackets fit; "Smith" NN is wrong
    # A possessive "'" may keep POS; a correct punctuation tag is never touched.
    assert punctuation_tag("'", "POS") == "POS" and punctuation_tag("--", ":") == ":"
    assert punctuation_tag("?", "NN") == "." and punctuation_tag("Bush", ",") == "NN"


@pytest.mark.parametrize("form", FORMS)
def test_empty_prediction_gives_a_flat_tree(form):
    fixed = repair("", JOHN.words(), form)
    _well_formed(fixed.tree, JOHN.words())
    expected_tags = ["XX"] * 6 if form == "vinyals" else ["NN"] * 5 + ["."]
    assert fixed.tree.label == "S" and fixed.tree.tags() == expected_tags
    assert all(child.is_leaf for child in fixed.tree.children)


def test_leaves_beside_the_root_are_taken_into_it():
    fixed = repair(". S NP NNP NNP /NP VP VBZ NP DT /NP /VP /S", JOHN.words())
    # the leading '.' leaf consumed 'John'; one word was missing and went to the root
    _well_formed(fixed.tree, JOHN.words())
    assert fixed.tree.label == "S" and fixed.fixes["top_level"] == 1


def test_several_roots_are_joined_under_s():
    fixed = repair("NP NNP NNP /NP VP VBZ NP DT NN /NP /VP .", JOHN.words())
    assert write_tree(fixed.tree) == write_tree(JOHN)


def test_unknown_label_that_closes_later_opens_a_constituent():
    tree = repair("S FOO NN NN /FOO VP VBZ /VP /S", "a b c").tree
    assert write_tree(tree) == "(S (FOO (NN a) (NN b)) (VP (VBZ c)))"


@pytest.mark.parametrize("form", FORMS)
def test_junk_never_raises_and_always_fits_the_words(form):
    rng = random.Random(7)
    vocab = {
        "t2t": ["S", "NP", "VP", "PP", "/S", "/NP", "/VP", "/PP", "NN", "DT", ".", ",", "FOO",
                "/FOO", "/", "((", ")", "(NP", "NP)", "//NP"],
        "vinyals": ["(S", "(NP", "(VP", ")S", ")NP", ")VP", ")", "XX", "XX", "(", "((S", "S)",
                    "junk", "(X)", ")("],
        "words": ["(S", "(NP", "(VP", ")S", ")NP", ")VP", ")", "NN", "DT", ".", ",", "w1", "w2",
                  "w3", "(", "((S", "S)", "(X)", ")("],
    }[form]  # fmt: skip
    for _ in range(300):
        words = [f"w{i}" for i in range(rng.randint(1, 12))] + ["."]
        tokens = [rng.choice(vocab) for _ in range(rng.randint(0, 40))]
        _well_formed(repair(tokens, words, form).tree, words)


def test_deep_nesting_does_not_recurse():
    tokens = ["NP"] * 5000 + ["NN"]
    tree = repair(tokens, ["word"]).tree
    assert tree.words() == ["word"]
    assert write_tree(tree).count("(NP") == 5000


def fixes_of(repaired):
    return dict(repaired.fixes)


# ----------------------------------------------------------------------------- the stage


def _treebank_folder(tmp_path, trees):
    """A finished treebank artifact (through the stage contract), as the treebank stage writes."""

    def build(tmp):
        (tmp / "train.trees").write_text("".join(write_tree(t) + "\n" for t in trees[:3]))
        (tmp / "dev.trees").write_text(write_tree(trees[3]) + "\n")
        (tmp / "test.trees").write_text("".join(write_tree(t) + "\n" for t in trees[3:]))

    return build_folder("treebank", tmp_path / "run" / "treebank", {"test": 1}, {}, build).path


@pytest.mark.parametrize("form", FORMS)
def test_linearize_stage_writes_the_clean_layout(tmp_path, trees, form):
    treebank = _treebank_folder(tmp_path, trees)
    config = config_from_dict(
        {
            "name": "p",
            "workdir": str(tmp_path / "run"),
            "data": PARSING_DATA,
            "parsing": {"form": form},
        }
    )
    out = run_stage(config, "linearize", {"treebank": treebank}).path
    assert out == tmp_path / "run" / "linearize"
    table = pq.read_table(out / "train" / "part-00000.parquet")
    assert table.schema.names == ["src", "tgt"]
    assert table.column("src").to_pylist() == [source(t) for t in trees[:3]]
    assert table.column("tgt").to_pylist() == [" ".join(linearize(t, form)) for t in trees[:3]]
    assert (out / "dev.words").read_text() == source(trees[3]) + "\n"
    test_words = (out / "test.words").read_text().splitlines()
    test_tree = (out / "test.tree").read_text().splitlines()
    assert test_words == [source(t) for t in trees[3:]]
    assert test_tree == [" ".join(linearize(t, form)) for t in trees[3:]]
    assert (out / "gold.trees").read_text() == (treebank / "test.trees").read_text()
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert (stats["train_pairs"], stats["dev_pairs"], stats["test_pairs"]) == (3, 1, 2)
    assert stats["form"] == form


def test_linearize_stage_adds_the_silver_corpus(tmp_path, trees):
    treebank = _treebank_folder(tmp_path, trees)
    silver = tmp_path / "silver.mrg"
    silver.write_text(MRG, encoding="utf-8")  # raw PTB text: cleaned on the way in
    config = config_from_dict(
        {
            "name": "p",
            "workdir": str(tmp_path / "run"),
            "data": PARSING_DATA,
            "parsing": {"silver_corpus": str(silver)},
        }
    )
    out = run_stage(config, "linearize", {"treebank": treebank}).path
    rows = pq.read_table(out / "train").column("src").to_pylist()
    assert rows == [source(t) for t in trees[:3]] + [source(t) for t in trees]  # gold, then silver
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert (stats["train_pairs"], stats["silver_pairs"]) == (3, 5)
