"""The parsing target as single pieces (``tokenizer.target_symbols``) and the constrained
decoding built on them (``parsing.constrain``, ``parsing.constrained``)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from corpora.subwords import TokenizerConfig, target_tokens, train
from parsing.constrain import bracket_vocab, token_classes
from parsing.linearize import POS_TAGS, linearize, repair, structure_tokens
from parsing.trees import parse_tree
from serving import tokenizer as tokenizer_lib
from serving.translator import DecodeConfig, Translator
from tasks.framework.config import config_from_dict
from transformer_core import Transformer, presets
from transformer_core.config_checks import ConfigError
from transformer_core.constraints import TreeConstraint
from transformer_core.search import SearchSettings, search

TREES = [
    "(S (NP (NNP John) (NNP Smith)) (VP (VBZ runs) (NP (DT a) (NN shop))) (. .))",
    "(S (NP (PRP She)) (VP (VBD said) (SBAR (IN that) (S (NP (PRP it)) (VP (VBD rained))))) (. .))",
    "(S (NP (DT The) (NNS prices)) (VP (VBD rose) (PP (IN in) (NP (NNP September)))) (. .))",
    "(S (NP (PRP$ Its) (NN stock)) (VP (VBD fell) (ADVP (RB sharply))) (. .))",
]


def _tokenizer(folder, form: str, vocab_size: int):
    """A sentencepiece model trained the tokenizer stage's way on TREES in ``form``, with the
    target tokens as symbols (in the words form: all but the words); and those symbols."""
    trees = [parse_tree(t) for t in TREES] * 20
    src = [" ".join(t.words()) for t in trees]
    tgt = [" ".join(linearize(t, form)) for t in trees]
    part = folder / "part-00000.parquet"
    pq.write_table(pa.table({"src": src, "tgt": tgt}), part)
    symbols = target_tokens([part], tokens_of=lambda t: structure_tokens(t, form))
    sentences = [s for pair in zip(src, tgt, strict=True) for s in pair]
    model = train(sentences, TokenizerConfig(vocab_size=vocab_size, threads=1), symbols)
    (folder / tokenizer_lib.MODEL_FILE).write_bytes(model.proto)
    return tokenizer_lib.load(folder), symbols


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """The t2t form's tokenizer."""
    return _tokenizer(tmp_path_factory.mktemp("tok"), "t2t", 120)[0]


@pytest.fixture(scope="module")
def words_tok(tmp_path_factory):
    """The words form's: its words keep their source pieces, the rest are symbols."""
    tokenizer, symbols = _tokenizer(tmp_path_factory.mktemp("words_tok"), "words", 150)
    assert "John" not in symbols and "(NP" in symbols and "NNP" in symbols
    return tokenizer


def test_target_tokens_are_the_distinct_tree_tokens_most_frequent_first(tmp_path):
    part = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table({"src": ["a b", "c"], "tgt": ["S NN NN /S", "S NN /S"]}), part)
    assert target_tokens([part]) == ["NN", "/S", "S"]


def test_every_target_token_is_one_piece_and_decodes_back(tok):
    for text in TREES:
        target = " ".join(linearize(parse_tree(text)))
        ids = tok.encode(target)[:-1]  # without EOS
        assert len(ids) == len(target.split()), tok.sp.encode(target, out_type=str)
        assert tok.decode(ids) == target
    # Source words still split into pieces (a word starting with a symbol, too).
    assert tok.decode(tok.encode("Smith said that prices rose")) == "Smith said that prices rose"


def test_too_many_target_tokens_for_the_vocabulary_is_an_error():
    from corpora import CorpusError

    with pytest.raises(CorpusError, match="target_symbols"):
        train(
            ["a b c"] * 10, TokenizerConfig(vocab_size=10, threads=1), [f"T{i}" for i in range(10)]
        )


def test_token_classes_of_both_forms():
    pieces = [
        "<pad>",
        "\u2581NP",
        "\u2581/NP",
        "\u2581NN",
        "\u2581FOO",
        "\u2581/FOO",
        "\u2581the",
        "NP",
    ]
    assert token_classes(pieces, "t2t") == {
        1: ("open", "NP"),
        2: ("close", "NP"),
        3: ("leaf", "NN"),
        4: ("open", "FOO"),  # not a Penn label, but its close is a piece
        5: ("close", "FOO"),
    }
    vinyals = ["\u2581(NP", "\u2581)NP", "\u2581XX", "\u2581NN", "\u2581("]
    assert token_classes(vinyals, "vinyals") == {
        0: ("open", "NP"),
        1: ("close", "NP"),
        2: ("leaf", "XX"),
    }


def test_constrained_translator_outputs_trees_over_the_words(tok):
    torch.manual_seed(0)
    model = Transformer(presets.debug().replace(max_len=128), tok.vocab_size).eval()
    words = ["John Smith runs a shop .", "Its stock fell sharply ."]
    free = Translator(model, tok, DecodeConfig(beam_size=3, alpha=0.3, max_len_offset=20))
    constrained = Translator(
        model,
        tok,
        DecodeConfig(beam_size=3, alpha=0.3, max_len_offset=20, tree_constraint="t2t"),
    )
    structural = {"label_mismatch", "stray_close", "unclosed", "extra_leaves", "missing_leaves",
                  "empty_constituent", "junk_token", "top_level", "flat"}  # fmt: skip
    untrained = [repair(h, w).fixes for h, w in zip(free.translate(words), words, strict=True)]
    assert any(structural & set(fixes) for fixes in untrained)  # an untrained model is junk
    for hyp, w in zip(constrained.translate(words), words, strict=True):
        # Nothing to repair, punctuation tags included: the final "." is tagged ".".
        assert not repair(hyp, w).fixes, hyp
        assert [t for t in hyp.split() if t in POS_TAGS][-1] == ".", hyp


@pytest.mark.parametrize("seed", [0, 1])
def test_words_form_copies_every_word_and_tags_it(words_tok, seed):
    torch.manual_seed(seed)
    model = Transformer(presets.debug().replace(max_len=128), words_tok.vocab_size).eval()
    words = ["John Smith runs a shop .", "Its stock fell sharply .", "Smithers said that"]
    config = DecodeConfig(beam_size=3, alpha=0.3, max_len_offset=30)
    free = Translator(model, words_tok, config)
    constrained = Translator(model, words_tok, dataclasses.replace(config, tree_constraint="words"))
    untrained = [
        repair(h, w, "words").fixes for h, w in zip(free.translate(words), words, strict=True)
    ]
    assert any(untrained)  # an untrained model writes no tree of its own
    for hyps, w in zip(constrained.translate_nbest(words, 3), words, strict=True):
        assert len(hyps) == 3
        for text, _ in hyps:
            assert not repair(text, w, "words").fixes, text  # a tree over the words, as written
            # Without the brackets: each word in order, each followed by one tag.
            rest = [t for t in text.split() if t[0] not in "()"]
            assert rest[0::2] == w.split(), text
            assert len(rest[1::2]) == len(w.split()) and set(rest[1::2]) <= POS_TAGS, text


def test_words_form_scores_a_word_by_the_chance_that_some_word_comes(words_tok):
    # A model that cannot copy: it always expects "She", a word of neither source. Scored by
    # its one piece, each source word would cost ~30 nats and labels would open until the
    # length limit; scored as "a word comes next" the words follow at once under one root.
    she = words_tok.sp.piece_to_id("\u2581She")
    assert she != words_tok.sp.unk_id()

    class CannotCopy(Transformer):
        def decode(self, tgt_in, memory, project=True):
            logits = super().decode(tgt_in, memory, project)
            logits[..., she] += 30.0
            return logits

    torch.manual_seed(0)
    model = CannotCopy(presets.debug().replace(max_len=128), words_tok.vocab_size).eval()
    words = ["John Smith runs a shop .", "Its stock fell sharply ."]
    ids = [words_tok.encode(w) for w in words]
    src = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    settings = SearchSettings(beam_size=3, alpha=0.3, max_len_offset=30, use_cache=False)
    found = search(model, src, settings, TreeConstraint(bracket_vocab(words_tok, "words")))
    for hyps, w in zip(found, words, strict=True):
        hyp = words_tok.decode(hyps[0].tokens)
        assert not repair(hyp, w, "words").fixes, hyp
        assert sum(t.startswith("(") for t in hyp.split()) == 1, hyp


def test_words_form_needs_the_joint_vocabulary(words_tok):
    with pytest.raises(ValueError, match="joint vocabulary"):
        bracket_vocab(words_tok, "words", 40)


def test_constraint_needs_single_piece_labels(tmp_path):
    model = train(["S NP NN /NP /S", "the cat"] * 20, TokenizerConfig(vocab_size=30, threads=1))
    (tmp_path / tokenizer_lib.MODEL_FILE).write_bytes(model.proto)
    with pytest.raises(ValueError, match="target_symbols: true"):
        bracket_vocab(tokenizer_lib.load(tmp_path), "t2t")


def test_parsing_constrained_sets_the_tree_constraint():
    def decoding(**parsing):
        return config_from_dict(
            {"name": "p", "data": {"source": "treebank", "pair": "words-tree"}, "parsing": parsing}
        ).decoding

    assert decoding().tree_constraint is None
    assert decoding(constrained=True).tree_constraint == "t2t"
    assert decoding(constrained=True, form="vinyals").tree_constraint == "vinyals"
    with pytest.raises(ConfigError, match="tree_constraint"):
        DecodeConfig(tree_constraint="t2t", engine="ctranslate2")
    with pytest.raises(ConfigError, match="tree_constraint"):
        DecodeConfig(tree_constraint="brackets")


def test_tokenizer_stage_makes_every_target_token_one_piece(tmp_path):
    from tasks.framework.runner import build_folder, run_stage
    from tasks.train import target_vocab_size

    trees = [parse_tree(t) for t in TREES]
    only_in_test = parse_tree("(S (INTJ (UH Oh)) (. .))")  # INTJ, UH: in no training tree

    def build(tmp):
        (tmp / "train.trees").write_text("".join(f"{t}\n" for t in trees * 10))
        (tmp / "dev.trees").write_text(f"{trees[0]}\n")
        (tmp / "test.trees").write_text(f"{only_in_test}\n")

    treebank = build_folder("treebank", tmp_path / "run" / "treebank", {"t": 1}, {}, build).path
    config = config_from_dict(
        {
            "name": "p",
            "workdir": str(tmp_path / "run"),
            "data": {"source": "treebank", "pair": "words-tree"},
            "tokenizer": {"vocab_size": 120, "threads": 1, "target_symbols": True},
        }
    )
    linearized = run_stage(config, "linearize", {"treebank": treebank}).path
    result = run_stage(config, "tokenizer", {"clean": linearized})
    tok = tokenizer_lib.load(result.path)
    symbols = result.stats["target_symbols"]
    for tree in [*trees, only_in_test]:
        target = " ".join(linearize(tree))
        ids = tok.encode(target)[:-1]
        assert len(ids) == len(target.split())
        assert max(ids) < target_vocab_size(config, {"tokenizer": result.path}) == 4 + symbols
