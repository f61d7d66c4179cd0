"""The WMT14 source registry: real URLs and layouts, direction handling, clear look-up errors."""

from __future__ import annotations

import pytest
from sacrebleu.dataset import DATASETS

from corpora import CorpusError, sources


def test_archives_are_statmt_urls_with_their_year_folder():
    expected = {
        "europarl-v7": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "commoncrawl": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "news-commentary-v9": "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
        "un": "https://www.statmt.org/wmt13/training-parallel-un.tgz",
        "giga-fren": "https://www.statmt.org/wmt10/training-giga-fren.tar",
    }
    assert {k: a.url for k, a in sources.ARCHIVES.items()} == expected
    # Dev and test archives are sacreBLEU's, under the same canonical host (the lock file's key).
    assert sources.archive("wmt14/full").url == "https://www.statmt.org/wmt14/test-full.tgz"
    assert sources.archive("wmt13").url == "https://www.statmt.org/wmt13/test.tgz"
    assert sources.archive("wmt14").md5 == DATASETS["wmt14"].md5[0]


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


def test_every_training_corpus_names_a_registered_archive_and_both_languages():
    entries = [(pair, c) for pair, table in sources.TRAIN.items() for c in table.values()]
    for pair, corpus in entries:
        assert corpus.archive in sources.ARCHIVES
        assert set(corpus.members) == set(pair.split("-")), (corpus.name, pair)
    assert len(entries) == 3 + 5


def test_subsets_pick_named_corpora_and_unknown_names_fail_with_the_known_ones():
    assert [c.name for c in sources.train_corpora("en-de", ["commoncrawl"])] == ["commoncrawl"]
    with pytest.raises(CorpusError, match="unknown corpus 'un' for en-de.*europarl-v7"):
        sources.train_corpora("en-de", ["un"])
    with pytest.raises(CorpusError, match="en-ja"):
        sources.train_corpora("en-ja")
    with pytest.raises(CorpusError, match="include English"):
        sources.statmt_pair("de-fr")
    with pytest.raises(ValueError, match="two different languages"):
        sources.split_pair("en-en")


def test_test_set_sides_follow_the_direction():
    en_de = sources.eval_set("newstest2014", "full", "en-de")
    de_en = sources.eval_set("newstest2014", "full", "de-en")
    assert en_de.members == {
        "en": "test-full/newstest2014-deen-src.en.sgm",
        "de": "test-full/newstest2014-deen-ref.de.sgm",
    }
    assert de_en.members == {
        "de": "test-full/newstest2014-deen-src.de.sgm",
        "en": "test-full/newstest2014-deen-ref.en.sgm",
    }
    assert (en_de.name, en_de.archive, en_de.lines, en_de.format) == (
        "newstest2014-full",
        "wmt14/full",
        3003,
        "sgm",
    )
    filtered = sources.eval_set("newstest2014", "filtered", "en-de")
    assert (filtered.name, filtered.archive, filtered.lines) == (
        "newstest2014-filtered",
        "wmt14",
        2737,
    )
    assert filtered.members["en"] == "test/newstest2014-deen-src.en.sgm"
    assert sources.eval_set("newstest2014", "filtered", "en-fr").lines is None  # none published
    with pytest.raises(CorpusError, match="unknown dev/test set 'newstest2015'"):
        sources.eval_set("newstest2015", "full", "en-de")
    with pytest.raises(CorpusError, match="has no en-ja data"):
        sources.eval_set("newstest2014", "full", "en-ja")


def test_dev_set_is_newstest2013_from_the_wmt13_test_release():
    dev = sources.eval_set("newstest2013", "full", "en-fr")
    assert (dev.name, dev.archive, dev.format, dev.lines) == ("newstest2013", "wmt13", "sgm", 3000)
    assert dev.members == {
        "en": "test/newstest2013-src.en.sgm",
        "fr": "test/newstest2013-src.fr.sgm",
    }
