"""Lowercasing and Moses tokenization before the subword model (corpora.pretokenize)."""

from __future__ import annotations

import pytest

from corpora import CorpusError
from corpora.pretokenize import FILE, Pretokenizer
from tasks.framework.config import config_from_dict


def test_moses_and_lowercase_split_punctuation_per_language():
    pre = Pretokenizer(("en", "de"), moses=True, lowercase=True)
    assert pre.prepare(["A man, in a red shirt, is sitting."], 0) == ["a man , in a red shirt , is sitting ."]
    assert pre.prepare(['Ein Mann sagt: "Hallo!"'], 1) == ['ein mann sagt : " hallo ! "']
    # no escaping: what sentencepiece reads is the text's own characters
    assert pre.prepare(["Tom & Jerry's <dog>"], 0) == ["tom & jerry 's < dog >"]


def test_restore_detokenizes_but_keeps_the_case():
    pre = Pretokenizer(("en", "de"), moses=True, lowercase=True)
    assert pre.restore(["ein mann , der auf einer bank sitzt ."]) == ["ein mann, der auf einer bank sitzt."]
    assert pre.restore(["tom 's dog"], side=0) == ["tom's dog"]


def test_lowercase_only_leaves_the_tokens_alone():
    pre = Pretokenizer(("en", "de"), lowercase=True)
    assert pre.prepare(["Ein Hund, der läuft."], 1) == ["ein hund, der läuft."]
    assert pre.restore(["ein hund , der"]) == ["ein hund , der"]
    assert pre.description == "lowercase"


def test_the_record_round_trips_and_identity_writes_nothing(tmp_path):
    Pretokenizer(("en", "de")).save(tmp_path)
    assert not (tmp_path / FILE).exists()
    assert Pretokenizer.load(tmp_path) is None
    pre = Pretokenizer(("de", "en"), moses=True, lowercase=True)
    pre.save(tmp_path)
    again = Pretokenizer.load(tmp_path)
    assert again == pre and again.description == "moses+lowercase"
    assert again.prepare(["Hallo, Welt."], 0) == ["hallo , welt ."]


def test_a_broken_record_is_one_line_naming_the_file(tmp_path):
    (tmp_path / FILE).write_text('{"moses": true}\n')
    with pytest.raises(CorpusError, match=f"{FILE}: not a pretokenization record"):
        Pretokenizer.load(tmp_path)


def test_the_config_takes_the_options():
    config = config_from_dict({"name": "x", "tokenizer": {"moses": True, "lowercase": True}})
    assert config.tokenizer.moses and config.tokenizer.lowercase
    assert not config_from_dict({"name": "x"}).tokenizer.moses
