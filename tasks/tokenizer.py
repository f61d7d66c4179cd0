"""Stage tokenizer: a joint sentencepiece model trained on a seeded sample of the clean corpus.

In: ``clean`` (``train/part-*.parquet``). Out: ``spm.model`` and ``spm.vocab`` (pieces and
scores, for people to read), and ``pretokenize.json`` when ``tokenizer.lowercase`` or
``tokenizer.moses`` is on (``corpora.pretokenize``: the text is lowercased and Moses-tokenized
before the subword model, here and wherever the folder is read). With ``tokenizer.kind:
subword-nmt`` the folder also holds ``bpe.codes``, learned here on the pretokenized sample and
applied wherever the folder is read. With ``tokenizer.target_symbols`` (the parsing configs) every
distinct training-target token is one piece. With ``tokenizer.model_file`` (a team's own
sentencepiece model) nothing is sampled or trained: the file, checked, is the folder's
``spm.model``, and its sha256 is in the stage's config. The choices (identity normalisation,
determinism, an exact vocabulary size) are explained in ``corpora.subwords``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext
from transformer_core.folders import file_identity

if TYPE_CHECKING:
    from corpora.pretokenize import Pretokenizer

log = logging.getLogger(__name__)

STAGE = "tokenizer"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The tokenizer section and the seed (it picks the sample); with ``model_file``, the
    section with each file's name and sha256 in place of its path (no sample: no seed)."""
    section = to_dict(config.tokenizer)
    if config.tokenizer.model_file is None:
        return {"tokenizer": section, "seed": config.seed}
    for key in ("model_file", "vocab_file"):
        if section.get(key) is not None:
            path = Path(section[key])
            section[key] = {"file": path.name, "sha256": file_identity(path)}
    return {"tokenizer": section}


def build(ctx: BuildContext) -> dict[str, Any]:
    """``inputs["clean"]`` -> the subword model in ``ctx.tmp`` (``tokenizer.model_file``: that
    model, checked)."""
    from corpora.pretokenize import Pretokenizer

    config = ctx.config
    tok = config.tokenizer
    pretokenizer = Pretokenizer(config.languages, moses=tok.moses, lowercase=tok.lowercase)
    if tok.model_file is not None:
        return _given(config, pretokenizer, ctx.tmp)
    return _trained(ctx, pretokenizer)


def _given(config: RunConfig, pretokenizer: Pretokenizer, tmp: Path) -> dict[str, Any]:
    """The team's tokenizer of ``tokenizer.model_file`` written into ``tmp`` as it is: a
    sentencepiece model, or subword-nmt codes whose vocabulary sentencepiece numbers."""
    from corpora import subwords
    from serving.tokenizer import MODEL_FILE, VOCAB_FILE

    tok = config.tokenizer
    path = Path(str(tok.model_file))
    if tok.kind == "subword-nmt":
        codes = subwords.given_codes(path)
        model = subwords.numbered(_vocabulary(Path(str(tok.vocab_file))), tok)
        pretokenizer = replace(pretokenizer, bpe_codes=codes)
    else:
        model = subwords.given_model(path, tok.vocab_size)
    (tmp / MODEL_FILE).write_bytes(model.proto)
    (tmp / VOCAB_FILE).write_text(model.vocab_listing(), encoding="utf-8")
    pretokenizer.save(tmp)
    log.info("tokenizer: %s as it is, %d pieces", path, tok.vocab_size)
    return {
        "kind": tok.kind,
        "model_file": path.name,
        "sha256": file_identity(path),
        "vocab_size": tok.vocab_size,
        "pretokenize": pretokenizer.description,
    }


def _vocabulary(path: Path) -> list[str]:
    """The pieces of ``tokenizer.vocab_file`` in file order (``piece count`` lines, as
    fairseq's dictionary: its reader's checks)."""
    from corpora import CorpusError
    from weight_adapters import WeightsError
    from weight_adapters.fairseq_vocab import read_dictionary

    if not path.is_file():
        raise CorpusError(f"tokenizer.vocab_file: {path} does not exist")
    try:
        return read_dictionary(path)
    except (WeightsError, UnicodeDecodeError) as exc:
        raise CorpusError(f"tokenizer.vocab_file: {exc}") from None


def _trained(ctx: BuildContext, pretokenizer: Pretokenizer) -> dict[str, Any]:
    """A subword model trained on a sample of ``inputs["clean"]``, written into ``ctx.tmp``."""
    from corpora import subwords
    from corpora.parquet import part_files
    from serving.tokenizer import MODEL_FILE, VOCAB_FILE, Tokenizer

    config, tmp = ctx.config, ctx.tmp
    clean = ctx.inputs["clean"]
    tok = config.tokenizer
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
