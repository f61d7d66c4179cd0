"""The WMT14 source registry: real URLs and layouts, direction handling, clear look-up errors."""

from __future__ import annotations

import pytest

from tasks import sources
from tasks.artifacts import StageError


def test_archives_are_statmt_urls_with_their_year_folder():
    expected = {
        "europarl-v7": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "commoncrawl": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "news-commentary-v9": "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
        "un": "https://www.statmt.org/wmt13/training-parallel-un.tgz",
        "giga-fren": "https://www.statmt.org/wmt10/training-giga-fren.tar",
        "dev": "https://www.statmt.org/wmt14/dev.tgz",
        "test-full": "https://www.statmt.org/wmt14/test-full.tgz",
        "test-filtered": "https://www.statmt.org/wmt14/test-filtered.tgz",
    }
    assert {k: a.url for k, a in sources.ARCHIVES.items()} == expected


def test_default_training_sets_follow_the_paper():
    en_de = [c.name for c in sources.train_corpora("en-de")]
    assert en_de == ["europarl-v7", "commoncrawl", "news-commentary-v9"]
    en_fr = [c.name for c in sources.train_corpora("en-fr")]
    assert en_fr == ["europarl-v7", "commoncrawl", "news-commentary-v9", "un", "giga-fren"]
    # The direction does not matter for training data: statmt names both de-en.
    assert sources.train_corpora("de-en") == sources.train_corpora("en-de")


def test_training_members_are_in_the_real_layouts():
    by_name = {c.name: c for c in sources.train_corpora("en-fr")}
    assert by_name["europarl-v7"].members == {
        "fr": "training/europarl-v7.fr-en.fr",
        "en": "training/europarl-v7.fr-en.en",
    }
    assert by_name["commoncrawl"].members["fr"] == "commoncrawl.fr-en.fr"
    assert by_name["news-commentary-v9"].members["en"] == "training/news-commentary-v9.fr-en.en"
    assert by_name["un"].members["fr"] == "un/undoc.2000.fr-en.fr"
    giga = by_name["giga-fren"]
    assert giga.format == "gzip"
    assert giga.members == {
        "fr": "giga-fren.release2.fixed.fr.gz",
        "en": "giga-fren.release2.fixed.en.gz",
    }


def test_every_corpus_names_a_registered_archive_and_both_languages():
    entries = [(pair, c) for pair, table in sources.TRAIN.items() for c in table.values()]
    entries += [(pair, c) for table in (*sources.DEV.values(), *sources.TEST.values()) for pair, c in table.items()]
    for pair, corpus in entries:
        assert corpus.archive in sources.ARCHIVES
        assert set(corpus.members) == set(pair.split("-")), (corpus.name, pair)
        if corpus.format == "tsv":
            assert set(corpus.columns) == set(pair.split("-"))
    assert len(entries) == 3 + 5 + 2 + 8


def test_subsets_pick_named_corpora_and_unknown_names_fail_with_the_known_ones():
    assert [c.name for c in sources.train_corpora("en-de", ["commoncrawl"])] == ["commoncrawl"]
    with pytest.raises(StageError, match="unknown corpus 'un' for en-de.*europarl-v7"):
        sources.train_corpora("en-de", ["un"])
    with pytest.raises(StageError, match="en-ja"):
        sources.train_corpora("en-ja")
    with pytest.raises(StageError, match="include English"):
        sources.statmt_pair("de-fr")


def test_test_set_sides_follow_the_direction():
    en_de = sources.get_test("newstest2014", "full", "en-de")
    de_en = sources.get_test("newstest2014", "full", "de-en")
    assert en_de.members == {
        "en": "test-full/newstest2014-deen-src.en.sgm",
        "de": "test-full/newstest2014-deen-ref.de.sgm",
    }
    assert de_en.members == {
        "de": "test-full/newstest2014-deen-src.de.sgm",
        "en": "test-full/newstest2014-deen-ref.en.sgm",
    }
    assert en_de.lines == 3003 and en_de.format == "sgm"
    filtered = sources.get_test("newstest2014", "filtered", "en-de")
    assert filtered.archive == "test-filtered" and filtered.lines == 2737
    assert filtered.members["en"] == "test/newstest2014-deen-src.en.sgm"
    with pytest.raises(StageError, match="unknown test set 'newstest2015'"):
        sources.get_test("newstest2015", "full", "en-de")


def test_dev_set_is_plain_text_newstest2013():
    dev = sources.get_dev("newstest2013", "en-fr")
    assert dev.archive == "dev" and dev.format == "text" and dev.lines == 3000
    assert dev.members == {"fr": "dev/newstest2013.fr", "en": "dev/newstest2013.en"}
    with pytest.raises(StageError, match="unknown dev set 'newstest2099'"):
        sources.get_dev("newstest2099", "en-de")


@pytest.mark.parametrize(("key", "dataset"), [("test-full", "wmt14/full"), ("test-filtered", "wmt14")])
def test_test_sets_agree_with_sacrebleus_table(key: str, dataset: str):
    """sacrebleu's dataset table is the reference for the test archives' md5 and member paths."""
    datasets = pytest.importorskip("sacrebleu.dataset").DATASETS
    reference = datasets[dataset]
    assert [sources.ARCHIVES[key].md5] == reference.md5
    assert reference.data[0].endswith(sources.ARCHIVES[key].path)
    variant = "full" if key == "test-full" else "filtered"
    for pair in ("en-de", "de-en", "en-fr", "fr-en"):
        src, tgt = pair.split("-")
        corpus = sources.get_test("newstest2014", variant, pair)
        assert [corpus.members[src], corpus.members[tgt]] == reference.langpairs[pair][:2]
