"""Stage tokenizer: a joint sentencepiece model trained on a seeded sample of the clean corpus.

In: ``clean`` (``train/part-*.parquet``). Out: ``spm.model`` and ``spm.vocab`` (pieces and
scores, for people to read), and ``pretokenize.json`` when ``tokenizer.lowercase`` or
``tokenizer.moses`` is on (``corpora.pretokenize``: the text is lowercased and Moses-tokenized
before the subword model, here and wherever the folder is read). With ``tokenizer.kind:
subword-nmt`` the folder also holds ``bpe.codes``, learned here on the pretokenized sample and
applied wherever the folder is read. With ``tokenizer.target_symbols`` (the parsing configs) every
distinct training-target token is one piece. The choices (identity normalisation, determinism,
an exact vocabulary size) are explained in ``corpora.subwords``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext

log = logging.getLogger(__name__)

STAGE = "tokenizer"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The tokenizer section and the seed (it picks the sample)."""
    return {"tokenizer": to_dict(config.tokenizer), "seed": config.seed}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["clean"]`` -> the subword model in ``ctx.tmp``."""
    from corpora import subwords
    from corpora.parquet import part_files
    from corpora.pretokenize import Pretokenizer
    from serving.tokenizer import MODEL_FILE, VOCAB_FILE, Tokenizer

    config, tmp = ctx.config, ctx.tmp
    clean = ctx.inputs["clean"]
    tok = config.tokenizer
    pretokenizer = Pretokenizer(config.languages, moses=tok.moses, lowercase=tok.lowercase)
    files = part_files(clean / "train")
    prepare = pretokenizer.prepare if pretokenizer.active else None
    sentences = subwords.sample_sentences(files, tok.sample_size, config.seed, prepare)
    if tok.merges is not None:  # subword-nmt: learn its codes, then number the pieces they make
        sample = list(sentences)
        pretokenizer = replace(pretokenizer, bpe_codes=subwords.learn_codes(sample, tok.merges))
        sentences = pretokenizer.segment(sample)
    symbols = []
    if tok.target_symbols:
        tgt = config.languages[1]
        texts = [clean / f"{split}.{tgt}" for split in ("dev", "test")]
        symbols = subwords.target_tokens(
            files, [t for t in texts if t.is_file()], _tokens_of(config)
        )
    model = subwords.train(sentences, tok, symbols)
    (tmp / MODEL_FILE).write_bytes(model.proto)
    (tmp / VOCAB_FILE).write_text(model.vocab_listing(), encoding="utf-8")
    pretokenizer.save(tmp)  # every reader of the folder applies the same step
    vocab_size = Tokenizer(tmp / MODEL_FILE).vocab_size  # and the ids the pipeline expects
    log.info("tokenizer: %s, %d pieces from %d sentences", tok.kind, vocab_size, model.sentences)
    return {
        "kind": tok.kind,
        "model_type": subwords.MODEL_TYPES[tok.kind],
        "vocab_size": vocab_size,
        "sentences": model.sentences,
        "normalization": subwords.NORMALIZATION,
        "pretokenize": pretokenizer.description,
        "target_symbols": len(symbols),
        **({"merges": tok.merges} if tok.merges is not None else {}),
    }


def _tokens_of(config: RunConfig) -> Callable[[str], list[str]]:
    """A target's tokens that become symbols: parsing's ``words`` form leaves its words out
    (they keep their source pieces); every other target gives all of its tokens."""
    from parsing.linearize import structure_tokens

    return lambda target: structure_tokens(target, config.parsing.form)
