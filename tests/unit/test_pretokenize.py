"""Lowercasing and Moses tokenization before the subword model (corpora.pretokenize)."""

from __future__ import annotations

import pytest

from corpora import CorpusError
from corpora.pretokenize import FILE, Pretokenizer
from tasks.framework.config import config_from_dict


def test_moses_and_lowercase_split_punctuation_per_language():
    pre = Pretokenizer(("en", "de"), moses=True, lowercase=True)
    assert pre.prepare(["A man, in a red shirt, is sitting."], 0) == [
        "a man , in a red shirt , is sitting ."
    ]
    assert pre.prepare(['Ein Mann sagt: "Hallo!"'], 1) == ['ein mann sagt : " hallo ! "']
    # no escaping: what sentencepiece reads is the text's own characters
    assert pre.prepare(["Tom & Jerry's <dog>"], 0) == ["tom & jerry 's < dog >"]


def test_restore_detokenizes_but_keeps_the_case():
    pre = Pretokenizer(("en", "de"), moses=True, lowercase=True)
    assert pre.restore(["ein mann , der auf einer bank sitzt ."]) == [
        "ein mann, der auf einer bank sitzt."
    ]
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


# --- subword-nmt's BPE (tokenizer.kind: subword-nmt) -----------------------------------------

CODES = "#version: 0.2\nm a\nma n</w>\ne i\nei n</w>\n"
"""Four merges: "man" and "ein" whole ("mann" only begins with "ma"), every other word in
letters."""


def test_bpe_codes_split_words_as_apply_bpe_and_restore_joins_them():
    pre = Pretokenizer(("en", "de"), moses=True, lowercase=True, bpe_codes=CODES)
    assert pre.prepare(["Ein Mann."], 1) == ["ein ma@@ n@@ n ."]
    assert pre.prepare(["A man"], 0) == ["a man"]
    # --remove-bpe, then Moses' detokenizer; a mark left at the end goes too
    assert pre.restore(["ein ma@@ n@@ n ."]) == ["ein mann."]
    assert pre.restore(["ein m@@"]) == ["ein m"]
    assert pre.description == "moses+lowercase+subword-nmt"


def test_the_codes_travel_in_their_own_file_and_a_missing_one_is_named(tmp_path):
    from corpora.pretokenize import CODES_FILE

    pre = Pretokenizer(("en", "de"), moses=True, bpe_codes=CODES)
    pre.save(tmp_path)
    assert (tmp_path / CODES_FILE).read_text() == CODES and CODES not in (
        tmp_path / FILE
    ).read_text()
    again = Pretokenizer.load(tmp_path)
    assert again == pre and again.prepare(["ein Mann", "a man"], 1) == [
        "ein M@@ a@@ n@@ n",
        "a man",
    ]
    (tmp_path / CODES_FILE).unlink()
    with pytest.raises(CorpusError, match=f"{CODES_FILE} does not exist: .*{FILE} names it"):
        Pretokenizer.load(tmp_path)
