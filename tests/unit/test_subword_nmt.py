"""tokenizer.kind: subword-nmt: subword-nmt's joint BPE, its pieces numbered by sentencepiece."""

from __future__ import annotations

import pytest

from corpora import CorpusError
from corpora.pretokenize import Pretokenizer
from corpora.subwords import TokenizerConfig, learn_codes, train
from serving.tokenizer import Tokenizer
from transformer_core.config_checks import ConfigError
from transformer_core.special_ids import UNK_ID

SENTENCES = [
    "a man in a red shirt is sitting on a bench .",
    "ein mann in einem roten hemd sitzt auf einer bank .",
    "two dogs are running through the snow .",
    "zwei hunde rennen durch den schnee .",
    "a woman is sitting on the grass with her dogs .",
    "eine frau sitzt mit ihren hunden im gras .",
] * 3


def model(tmp_path, merges=40):
    codes = learn_codes(SENTENCES, merges)
    pre = Pretokenizer(("en", "de"), bpe_codes=codes)
    segmented = pre.segment(SENTENCES)
    config = TokenizerConfig(kind="subword-nmt", merges=merges, vocab_size=400, threads=1)
    built = train(segmented, config)
    (tmp_path / "spm.model").write_bytes(built.proto)
    return codes, segmented, Tokenizer(tmp_path / "spm.model", pre)


def test_the_codes_hold_the_merges_asked_for(capsys):
    codes = learn_codes(SENTENCES, 40).splitlines()
    assert codes[0] == "#version: 0.2" and len(codes) == 41
    assert all(len(line.split(" ")) == 2 for line in codes[1:])
    # more merges than pairs of frequency 2: fewer codes, and subword-nmt's note stays off the
    # console
    assert len(learn_codes(SENTENCES, 5000).splitlines()) < 5001
    assert capsys.readouterr().err == ""


def test_every_piece_of_the_sample_is_one_id_and_decodes_back(tmp_path):
    _, segmented, tok = model(tmp_path)
    distinct = {p for s in segmented for p in s.split()}
    assert tok.vocab_size == len(distinct) + 4
    assert any("@@" in p for p in distinct)  # 40 merges leave words in pieces
    for sentence, pieces in zip(SENTENCES, segmented, strict=True):
        ids = tok.encode(sentence)[:-1]
        assert len(ids) == len(pieces.split()) and UNK_ID not in ids
        assert tok.decode(ids) == sentence  # the marks removed, as --remove-bpe


def test_a_piece_never_seen_is_unknown(tmp_path):
    _, _, tok = model(tmp_path)
    ids = tok.encode("a man with a xylophone")[:-1]
    assert UNK_ID in ids and ids[:2] == tok.encode("a man")[:2]


def test_a_vocabulary_too_small_for_the_merges_names_the_key(tmp_path):
    codes = learn_codes(SENTENCES, 40)
    segmented = Pretokenizer(("en", "de"), bpe_codes=codes).segment(SENTENCES)
    with pytest.raises(
        CorpusError, match="tokenizer.vocab_size: 20 cannot hold the .* tokenizer.merges 40"
    ):
        train(segmented, TokenizerConfig(kind="subword-nmt", merges=40, vocab_size=20, threads=1))


@pytest.mark.parametrize(
    "changes", [{"kind": "subword-nmt"}, {"merges": 100}, {"kind": "subword-nmt", "merges": 0}]
)
def test_merges_go_with_the_kind_and_nothing_else(changes):
    with pytest.raises(ConfigError, match="merges"):
        TokenizerConfig(**changes)


def test_train_takes_the_pieces_the_merges_made_up_to_vocab_size(tmp_path):
    from tasks.framework.config import config_from_dict
    from tasks.framework.results import StageError
    from tasks.train import vocab_size

    _, _, tok = model(tmp_path)
    folders = {"tokenizer": tmp_path, "shard": tmp_path}

    def config(**tokenizer):
        return config_from_dict({"name": "x", "tokenizer": {"threads": 1, **tokenizer}})

    assert (
        vocab_size(config(kind="subword-nmt", merges=40, vocab_size=400), folders, {})
        == tok.vocab_size
    )
    with pytest.raises(
        StageError, match=f"tokenizer.vocab_size: the config says {tok.vocab_size - 1} but"
    ):
        vocab_size(
            config(kind="subword-nmt", merges=40, vocab_size=tok.vocab_size - 1), folders, {}
        )
    with pytest.raises(StageError, match="tokenizer.vocab_size: the config says 400 but"):
        vocab_size(config(vocab_size=400), folders, {})  # sentencepiece's own BPE: exactly


def test_dev_bleu_reads_words_not_pieces(tmp_path):
    from training.worker import _pieces_text

    _, segmented, tok = model(tmp_path)
    tok.pretokenizer.save(tmp_path)  # the folder as the tokenizer stage leaves it
    text = _pieces_text(str(tmp_path / "spm.model"))
    ids = tok.encode(SENTENCES[1])[:-1]
    assert "@@" in segmented[1] and text(ids) == SENTENCES[1]


def test_a_piece_longer_than_sentencepieces_piece_limit_keeps_its_id(tmp_path):
    long_word = "fahrradfahrerinnengruppe"  # 24 characters; its BPE and unigram pieces stop at 16
    sentences = SENTENCES + [f"die {long_word} fährt ."] * 30
    codes = learn_codes(sentences, 60)
    pre = Pretokenizer(("en", "de"), bpe_codes=codes)
    assert pre.segment([long_word]) == [long_word]  # the merges made it one piece
    built = train(
        pre.segment(sentences),
        TokenizerConfig(kind="subword-nmt", merges=60, vocab_size=400, threads=1),
    )
    (tmp_path / "spm.model").write_bytes(built.proto)
    ids = Tokenizer(tmp_path / "spm.model", pre).encode(long_word)
    assert len(ids) == 2 and UNK_ID not in ids
