"""The NLTK 10% WSJ sample (shared/data/ptb_sample): reading, scoring, round trips, and the
treebank and linearize stages. Skipped where the shared data folder is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.stage_folders import finished_folder

from evaluation.evalb import score_corpus
from parsing.linearize import FORMS, linearize, punctuation_tag, repair
from parsing.trees import clean_tree, read_trees, write_tree
from tasks.framework.config import config_from_dict
from tasks.framework.runner import run_stage

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ptb_sample"
COMBINED = SAMPLE / "combined"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,  # the shared real-data samples run in the slow suite: ~15 s in all
    pytest.mark.shared_data("ptb_sample/combined"),
]

# wsj_0001 .. wsj_0180 train (180 files), wsj_0181 .. wsj_0199 test (19 files), no dev.
TRAIN = ["wsj_00*.mrg", "wsj_01[0-7]?.mrg", "wsj_0180.mrg"]
TEST = ["wsj_018[1-9].mrg", "wsj_019?.mrg"]


@pytest.fixture(scope="module")
def golds():
    raw = [tree for path in sorted(COMBINED.glob("wsj_*.mrg")) for tree in read_trees(path)]
    assert len(raw) == 3914
    cleaned = [clean_tree(t) for t in raw]
    assert all(t is not None for t in cleaned)
    return cleaned


def test_gold_against_gold_scores_100(golds):
    total, _ = score_corpus(golds, golds)
    assert (total.f1, total.exact_match, total.tagging_accuracy) == (100.0, 100.0, 100.0)
    assert total.sentences == total.valid == 3914
    assert total.gold > 60_000  # ~19 brackets per sentence: the scorer counts real brackets


@pytest.mark.parametrize("form", FORMS)
def test_round_trip_scores_100(golds, form):
    back = [
        repair(
            linearize(tree, form),
            tree.words(),
            form,
            tags=tree.tags() if form == "vinyals" else None,
        ).tree
        for tree in golds
    ]
    total, _ = score_corpus(golds, back)
    assert (total.f1, total.exact_match) == (100.0, 100.0)
    # Repair lets the word decide punctuation tags; the sample itself once tags a word as
    # punctuation ("Wa" as ","), and only such gold quirks may become length errors.
    quirks = sum(
        any(punctuation_tag(w, t) != t for w, t in zip(tree.words(), tree.tags(), strict=True))
        for tree in golds
    )
    assert total.errors == (0 if form == "vinyals" else quirks)
    assert quirks <= 1


def test_stages_on_the_sample(tmp_path, golds):
    config = config_from_dict(
        {
            "name": "ptb",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "treebank", "pair": "words-tree"},
            "parsing": {
                "treebank_dir": str(COMBINED),
                "train_files": TRAIN,
                "dev_files": [],
                "test_files": TEST,
            },
        }
    )
    tb = run_stage(config, "treebank", {}).path
    stats = json.loads((tb / "manifest.json").read_text())["stats"]
    assert (stats["train_files"], stats["dev_files"], stats["test_files"]) == (180, 0, 19)
    assert stats["train_trees"] + stats["test_trees"] == 3914 and stats["dev_trees"] == 0
    test_trees = (tb / "test.trees").read_text().splitlines()
    assert test_trees == [write_tree(t) for t in golds[-stats["test_trees"] :]]

    lin = run_stage(config, "linearize", {"treebank": tb}).path
    table = pq.read_table(lin / "train" / "part-00000.parquet")
    assert table.num_rows == stats["train_trees"]
    first = golds[0]
    assert table.column("src")[0].as_py() == " ".join(first.words())
    assert table.column("tgt")[0].as_py() == " ".join(linearize(first, "t2t"))
    assert len((lin / "test.words").read_text().splitlines()) == stats["test_trees"]
    assert (lin / "gold.trees").read_text() == (tb / "test.trees").read_text()
    assert (lin / "dev.words").read_text() == ""

    # Up to date: a second run returns at once.
    started = json.loads((lin / "manifest.json").read_text())["started"]
    assert not run_stage(config, "linearize", {"treebank": tb}).ran
    assert json.loads((lin / "manifest.json").read_text())["started"] == started

    # A perfect "translation" (the gold sequences) scores 100 through parse_score.
    def fake_translate(tmp):
        (tmp / "hyp.tree").write_text((lin / "test.tree").read_text())

    translated = finished_folder(
        tmp_path / "run" / "translate", "translate", {"fake": 1}, fake_translate
    )
    scored = run_stage(config, "parse_score", {"translate": translated, "linearize": lin}).path
    scores = json.loads((scored / "scores.json").read_text())
    assert scores["f1"] == 100.0 and scores["sentences"] == stats["test_trees"]
    assert scores["repaired_sentences"] == 0 and scores["length_errors"] == 0
