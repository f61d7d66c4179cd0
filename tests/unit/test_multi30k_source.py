"""The Multi30k registry, its mirror mapping and the multi30k data config: real repository layout,
either direction, one clear error line per bad key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from corpora import CorpusError, sources
from corpora.fetch import mirror_url
from tasks.framework.config import ConfigError, DataConfig, config_from_dict, load_config, to_dict

RAW = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"


def test_the_registry_lists_every_test_set_with_its_urls():
    assert sources.multi30k_test_sets() == {
        "test_2016_flickr": {
            lang: f"{RAW}test_2016_flickr.{lang}.gz" for lang in ("en", "de", "fr", "cs")
        },
        "test_2017_flickr": {
            lang: f"{RAW}test_2017_flickr.{lang}.gz" for lang in ("en", "de", "fr")
        },
        "test_2017_mscoco": {
            lang: f"{RAW}test_2017_mscoco.{lang}.gz" for lang in ("en", "de", "fr")
        },
        "test_2018_flickr": {
            lang: f"{RAW}test_2018_flickr.{lang}.gz" for lang in ("en", "de", "fr", "cs")
        },
    }


def test_splits_have_their_published_counts_and_gzip_files():
    counts = {name: c.lines for name, c in sources.MULTI30K_EVAL.items()}
    assert counts == {
        "val": 1014,
        "test_2016_flickr": 1000,
        "test_2017_flickr": 1000,
        "test_2017_mscoco": 461,
        "test_2018_flickr": 1071,
    }
    train = sources.MULTI30K_TRAIN
    assert (train.name, train.lines, train.format) == ("multi30k", 29000, "gzip")
    assert train.members == {
        lang: f"data/task1/raw/train.{lang}.gz" for lang in ("en", "de", "fr", "cs")
    }
    assert sources.multi30k_file(train.members["de"]).url == RAW + "train.de.gz"
    assert (sources.MULTI30K_DEV, sources.MULTI30K_TEST) == ("val", "test_2016_flickr")


def test_sides_follow_the_direction():
    assert sources.multi30k_train("de-en").members == {
        "de": "data/task1/raw/train.de.gz",
        "en": "data/task1/raw/train.en.gz",
    }
    en_cs = sources.multi30k_eval_set("test_2018_flickr", "en-cs")
    assert en_cs.members == {
        "en": "data/task1/raw/test_2018_flickr.en.gz",
        "cs": "data/task1/raw/test_2018_flickr.cs.gz",
    }
    assert (en_cs.name, en_cs.lines) == ("test_2018_flickr", 1071)
    # The registry's own table keeps every language: a look-up copies, never narrows it.
    assert set(sources.MULTI30K_EVAL["test_2018_flickr"].members) == {"en", "de", "fr", "cs"}


def test_look_ups_name_what_is_missing():
    with pytest.raises(
        CorpusError,
        match=r"unknown Multi30k dev/test set 'test_2019' \(known: val, test_2016_flickr,",
    ):
        sources.multi30k_eval_set("test_2019", "en-de")
    with pytest.raises(
        CorpusError, match=r"Multi30k test_2017_mscoco has no 'cs' text \(it has en, de, fr\)"
    ):
        sources.multi30k_eval_set("test_2017_mscoco", "cs-en")
    with pytest.raises(CorpusError, match="Multi30k train has no 'ja' text"):
        sources.multi30k_train("en-ja")


def test_a_mirror_replaces_the_repository_root_and_statmt_is_unchanged():
    url = RAW + "val.de.gz"
    base = (sources.MULTI30K,)
    assert (
        mirror_url(url, "file:///work/shared/data/multi30k", base)
        == "file:///work/shared/data/multi30k/data/task1/raw/val.de.gz"
    )
    assert (
        mirror_url(url, "http://10.0.0.5:8000/m30k/", base)
        == "http://10.0.0.5:8000/m30k/data/task1/raw/val.de.gz"
    )
    assert mirror_url(url, None, base) == url
    wmt = sources.ARCHIVES["europarl-v7"]
    assert wmt.url == "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    assert (
        mirror_url(wmt.url, "file:///m", (wmt.base,))
        == "file:///m/wmt13/training-parallel-europarl-v7.tgz"
    )


# ----------------------------------------------------------------------------- the config


def test_dev_and_test_default_to_the_sources_standard_sets():
    assert DataConfig(source="multi30k").eval_sets == ("val", "test_2016_flickr")
    wmt = DataConfig(source="wmt14")
    assert (*wmt.eval_sets, wmt.test_variant) == ("newstest2013", "newstest2014", "full")
    # A local corpus's sets are named by their prefixes (the score stage reports data.test);
    # the synthetic corpus keeps the names it always had.
    assert DataConfig().eval_sets == ("newstest2013", "newstest2014")
    local = DataConfig(source="local", local_dev="dev", local_test="held_out/news2024")
    assert local.eval_sets == ("dev", "news2024")
    assert DataConfig(source="local", local_test="x", test="mine").eval_sets[1] == "mine"
    chosen = DataConfig(source="multi30k", pair="fr-en", test="test_2017_mscoco")
    assert chosen.eval_sets == ("val", "test_2017_mscoco")
    # The loader keeps the names in the value (built as written: dev and test stay null), so
    # what a manifest records is the resolved name, and it reads back as the same config.
    assert chosen.dev is None
    loaded = config_from_dict({"name": "m", "data": to_dict(chosen)}).data
    assert (loaded.dev, loaded.test) == ("val", "test_2017_mscoco")
    data = to_dict(loaded)
    assert data["dev"] == "val" and config_from_dict({"name": "m", "data": data}).data == loaded


@pytest.mark.parametrize("pair", ["en-de", "de-en", "fr-en", "en-cs", "cs-de"])
def test_every_direction_of_the_four_languages_is_accepted(pair: str):
    assert DataConfig(source="multi30k", pair=pair).pair == pair


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        ({"pair": "en-ja"}, "data.pair", "Multi30k train has no 'ja' text (it has en, de, fr, cs)"),
        (
            {"pair": "en-cs", "test": "test_2017_flickr"},
            "data.test",
            "Multi30k test_2017_flickr has no 'cs' text (it has en, de, fr)",
        ),
        (
            {"test": "newstest2014"},
            "data.test",
            "unknown Multi30k dev/test set 'newstest2014' (known: val, test_2016_flickr, ",
        ),
        ({"dev": "train"}, "data.dev", "unknown Multi30k dev/test set 'train'"),
        ({"test_variant": "filtered"}, "data.test_variant", "'filtered' is a newstest2014 release"),
        (
            {"corpora": ["europarl-v7"]},
            "data.corpora",
            "['europarl-v7']: Multi30k has one training corpus",
        ),
    ],
)
def test_a_bad_multi30k_config_fails_with_one_line_naming_the_key(
    tmp_path: Path, data: dict, key: str, message: str
):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "data": {"source": "multi30k", **data}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.key == key
    text = str(err.value)
    assert text.startswith(f"{key}: {message}") and str(path) in text
    assert "\n" not in text


def test_wmt14_names_are_not_checked_against_multi30k():
    config = config_from_dict(
        {"name": "w", "data": {"source": "wmt14", "pair": "en-fr", "test_variant": "filtered"}}
    )
    assert (config.data.dev, config.data.test) == ("newstest2013", "newstest2014")
