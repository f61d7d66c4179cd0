"""Tree type, PTB reader, cleaning, splits and the treebank stage."""

from __future__ import annotations

import json

import pytest

from parsing.trees import (
    Tree,
    TreebankError,
    clean_tree,
    iter_trees,
    parse_tree,
    read_trees,
    strip_label,
    write_tree,
)
from tasks.framework.config import ParsingConfig, config_from_dict
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage
from tasks.treebank import split_files

# Three WSJ-style trees as in a .mrg file: empty root bracket, several lines per tree, function
# tags, indices, traces (-NONE-), a constituent holding only a trace, punctuation, PRT.
MRG = """\
( (S
    (NP-SBJ-1 (NNP Pierre) (NNP Vinken) )
    (VP (MD will)
      (VP (VB join)
        (NP (DT the) (NN board) )
        (PP-CLR (IN as)
          (NP (DT a) (JJ nonexecutive) (NN director) ))
        (NP-TMP (NNP Nov.) (CD 29) )))
    (. .) ))
( (S
    (NP-SBJ (PRP He) )
    (VP (VBD gave)
      (PRT (RP up) )
      (SBAR (-NONE- 0)
        (S (-NONE- *T*-1) ))
      (PP-LOC=2 (IN in)
        (NP (-LRB- -LRB-) (NNP Paris) (-RRB- -RRB-) )))
    (, ,)
    (`` ``) (NP-SBJ (-NONE- *-1) ) (ADVP|PRT (RB too) ) ('' '') (. .) ))
( (NP (NN Stock) (NNS prices) (: --) ) )
"""


@pytest.fixture
def mrg_file(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(MRG, encoding="utf-8")
    return path


def test_reads_multiline_mrg_and_strips_the_empty_root(mrg_file):
    trees = list(read_trees(mrg_file))
    assert [t.label for t in trees] == ["S", "S", "NP"]
    assert (
        trees[0].words()
        == "Pierre Vinken will join the board as a nonexecutive director Nov. 29 .".split()
    )
    assert trees[0].children[0].label == "NP-SBJ-1"  # raw: cleaning is separate
    assert trees[1].tags().count("-NONE-") == 3


def test_one_tree_per_line_reads_the_same(mrg_file, tmp_path):
    trees = list(read_trees(mrg_file))
    flat = tmp_path / "flat.trees"
    flat.write_text("".join(write_tree(t) + "\n" for t in trees), encoding="utf-8")
    assert list(read_trees(flat)) == trees
    assert all("\n" not in write_tree(t) for t in trees)


def test_write_tree_is_single_line_bracketed():
    tree = parse_tree("(TOP (S (NP (NNP John)) (VP (VBZ runs)) (. .)))")
    assert write_tree(tree) == "(S (NP (NNP John)) (VP (VBZ runs)) (. .))"
    assert parse_tree(write_tree(tree)) == tree


def test_a_root_over_several_constituents_becomes_top():
    tree = parse_tree("( (S (VP (VB Go))) (. .) )")
    assert tree.label == "TOP" and len(tree.children) == 2
    assert parse_tree(write_tree(tree)) == tree


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("NP-SBJ", "NP"),
        ("PP-LOC-CLR", "PP"),
        ("NP-SBJ-1", "NP"),
        ("NP=2", "NP"),
        ("PP-LOC=2", "PP"),
        ("S-TPC-1", "S"),
        ("ADVP|PRT", "ADVP"),
        ("-NONE-", "-NONE-"),
        ("-LRB-", "-LRB-"),
        ("-RRB-", "-RRB-"),
        ("PRP$", "PRP$"),
        ("NP", "NP"),
    ],
)
def test_strip_label(label, expected):
    assert strip_label(label) == expected


def test_clean_removes_traces_empty_constituents_and_function_tags(mrg_file):
    cleaned = [clean_tree(t) for t in read_trees(mrg_file)]
    assert write_tree(cleaned[0]) == (
        "(S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) "
        "(PP (IN as) (NP (DT a) (JJ nonexecutive) (NN director))) (NP (NNP Nov.) (CD 29)))) (. .))"
    )
    # SBAR held only traces (and an S of only a trace): gone, recursively; so is NP-SBJ (*-1).
    assert write_tree(cleaned[1]) == (
        "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)) (PP (IN in) (NP (-LRB- -LRB-) (NNP Paris) "
        "(-RRB- -RRB-)))) (, ,) (`` ``) (ADVP (RB too)) ('' '') (. .))"
    )
    assert write_tree(cleaned[2]) == "(NP (NN Stock) (NNS prices) (: --))"
    assert list(read_trees(mrg_file, clean=True)) == cleaned


def test_clean_of_a_tree_of_only_traces_is_none():
    assert clean_tree(parse_tree("( (S (NP-SBJ (-NONE- *)) (VP (-NONE- *?*))) )")) is None


def test_tree_rejects_text_that_would_not_read_back():
    with pytest.raises(ValueError):
        Tree("NN", word="two words")
    with pytest.raises(ValueError):
        Tree("NN", word="a(b")
    with pytest.raises(ValueError):
        Tree("NN", (Tree("DT", word="a"),), word="b")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("( (S (NP (NN a)) ))\n(S (NP (NN b))))\n", 2, "')' without a matching '('"),
        ("( (S (NP (NN a))\n  (VP (VB go))\n", 2, "opened at line 1 is not closed"),
        ("( (S (NN a)) )\nstray words\n( (S (NN b)) )\n", 2, "stray text 'stray'"),
        ("( (S\n (NN a b)) )\n", 2, "more than one word"),
        ("( (S (NN a)\n word (NN b)) )\n", 2, "word 'word' among the brackets"),
        ("( (S (NN a) () ) )\n", 1, "empty brackets"),
        ("( (S (NN a) (NP) ) )\n", 1, "neither a word nor children"),
        ("(S\n\n ( (NN a)) )\n", 3, "a bracket without a label"),
    ],
)
def test_malformed_input_fails_with_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.mrg"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TreebankError) as info:
        list(read_trees(path))
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert message in str(info.value)
    assert info.value.line == line and info.value.source == str(path)


def test_reading_streams():
    def lines():
        yield "( (S (NN a)) )\n"
        yield "( (S (NN b)) )\n"
        raise AssertionError("read past the second tree")

    trees = iter_trees(lines())
    assert next(trees).words() == ["a"]
    assert next(trees).words() == ["b"]


# ----------------------------------------------------------------------------- splits and stage


def _wsj(tmp_path):
    """A WSJ-like layout: <root>/<section>/wsj_SS01.mrg for sections 00..24, one tree each."""
    root = tmp_path / "wsj"
    for section in range(25):
        folder = root / f"{section:02d}"
        folder.mkdir(parents=True)
        words = " ".join(f"(NN w{section}x{i})" for i in range(section % 3 + 1))
        (folder / f"wsj_{section:02d}01.mrg").write_text(
            f"( (S (NP-SBJ {words})\n (VP (-NONE- *)) (. .)) )\n", encoding="utf-8"
        )
    return root


def test_default_globs_give_the_standard_wsj_splits(tmp_path):
    root = _wsj(tmp_path)
    files = split_files(ParsingConfig(treebank_dir=str(root)))
    assert [p.parent.name for p in files["train"]] == [f"{s:02d}" for s in range(2, 22)]
    assert [p.name for p in files["dev"]] == ["wsj_2201.mrg"]
    assert [p.name for p in files["test"]] == ["wsj_2301.mrg"]


def test_split_errors(tmp_path):
    root = _wsj(tmp_path)
    with pytest.raises(StageError, match="treebank_dir is not set") as err:
        split_files(ParsingConfig())
    assert "`python -m nltk.downloader treebank`" in str(err.value)
    with pytest.raises(StageError, match="'99/\\*.mrg' matches no file"):
        split_files(ParsingConfig(treebank_dir=str(root), dev_files=("99/*.mrg",)))
    with pytest.raises(StageError, match="in both the train and the test split"):
        split_files(ParsingConfig(treebank_dir=str(root), test_files=("21/*.mrg",)))
    files = split_files(ParsingConfig(treebank_dir=str(root), dev_files=()))
    assert files["dev"] == []


def test_treebank_stage_writes_cleaned_splits_and_skips_when_up_to_date(tmp_path):
    root = _wsj(tmp_path)
    config = config_from_dict(
        {
            "name": "wsj",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "treebank", "pair": "words-tree"},
            "parsing": {"treebank_dir": str(root)},
        }
    )
    out = run_stage(config, "treebank", {}).path
    assert out == tmp_path / "run" / "treebank"
    train = (out / "train.trees").read_text().splitlines()
    assert len(train) == 20
    assert train[0] == "(S (NP (NN w2x0) (NN w2x1) (NN w2x2)) (. .))"  # VP of a trace: gone
    assert (out / "test.trees").read_text() == "(S (NP (NN w23x0) (NN w23x1) (NN w23x2)) (. .))\n"
    manifest = json.loads((out / "manifest.json").read_text())
    stats = manifest["stats"]
    assert (stats["train_trees"], stats["dev_trees"], stats["test_trees"]) == (20, 1, 1)
    # sections 02..21: (s % 3 + 1) words each, plus the period
    assert stats["train_words"] == sum(s % 3 + 2 for s in range(2, 22))
    again = run_stage(config, "treebank", {})
    assert again.path == out and not again.ran
    assert json.loads((out / "manifest.json").read_text())["started"] == manifest["started"]
    # A changed treebank file changes the fingerprint: the stage runs again.
    (root / "23" / "wsj_2301.mrg").write_text("( (S (NN changed) (. .)) )\n", encoding="utf-8")
    assert run_stage(config, "treebank", {}).ran
    assert (out / "test.trees").read_text() == "(S (NN changed) (. .))\n"


def test_treebank_stage_reports_a_malformed_file(tmp_path):
    root = _wsj(tmp_path)
    bad = root / "05" / "wsj_0501.mrg"
    bad.write_text("( (S (NN a)\n", encoding="utf-8")
    config = config_from_dict(
        {
            "name": "w",
            "workdir": str(tmp_path / "run"),
            "parsing": {"treebank_dir": str(root)},
            "data": {"source": "treebank", "pair": "words-tree"},
        }
    )
    with pytest.raises(TreebankError, match="wsj_0501.mrg:1: unbalanced"):
        run_stage(config, "treebank", {})
    assert not (tmp_path / "run" / "treebank").exists()


def test_an_unset_treebank_dir_is_nltks_sample_where_the_downloader_puts_it(tmp_path, monkeypatch):
    from parsing.nltk_sample import SAMPLE, find_sample

    first, second = tmp_path / "first", tmp_path / "second"
    (second / SAMPLE).mkdir(parents=True)
    assert find_sample([first, second]) == second / "corpora" / "treebank" / "combined"
    assert find_sample([first]) is None
    # The treebank stage gives a config that names no folder the sample of NLTK's data
    # folders (NLTK_DATA first, as NLTK searches them), and fingerprints it; one that names a
    # folder keeps it. Loading looks at no data folder.
    from tasks.treebank import located, stage_config

    monkeypatch.setenv("NLTK_DATA", str(second))
    data = {"name": "p", "data": {"source": "treebank", "pair": "words-tree"}}
    config = config_from_dict(data)
    assert config.parsing.treebank_dir is None
    assert located(config.parsing).treebank_dir == str(second / SAMPLE)
    assert stage_config(config)["treebank_dir"] == str(second / SAMPLE)
    named = config_from_dict({**data, "parsing": {"treebank_dir": str(first)}})
    assert located(named.parsing).treebank_dir == str(first)
