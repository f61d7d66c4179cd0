"""Subword models: a joint sentencepiece model trained on a seeded sample of a clean corpus.

``kind: bpe`` is the paper's byte-pair encoding (37,000 shared pieces for En-De).
``kind: wordpiece`` is sentencepiece's unigram model: GNMT's word-piece model (the paper's En-Fr
vocabulary, 32,000) was never released, and the unigram model is its open stand-in.
``kind: subword-nmt`` is the BPE of fairseq's published recipes: ``tokenizer.merges`` joint merges
learned by subword-nmt (``learn-bpe``, minimum pair frequency 2) on the pretokenized sample,
applied as ``apply-bpe`` does (``corpora.pretokenize``; the folder keeps the codes). sentencepiece
then only numbers the pieces (a ``word`` model over the segmented sample): the vocabulary is every
distinct piece of the sample, as fairseq's joined dictionary, and a piece never seen is ``<unk>``.

Choices, deliberately:
- ``normalization_rule_name=identity``: the clean stage has already applied NFC, removed control
  characters and collapsed whitespace. NFKC (sentencepiece's default) would also fold ligatures,
  full-width forms and fractions, so ``decode(encode(x)) != x`` and hypotheses would lack
  characters that the references contain. With identity, decode(encode(x)) == x for any text the
  clean stage produced whose characters the model covers.
- Determinism: we pass the sampled sentences ourselves, in corpus order, with
  ``input_sentence_size=0`` and ``shuffle_input_sentence=False``, so the same config gives the
  same model bytes.
- A ``vocab_size`` larger than the sample supports is an error naming ``tokenizer.vocab_size``
  (never a silently smaller vocabulary: the size is a model hyperparameter).
- ``target_symbols`` (the parsing configs): every distinct token of the targets (tree labels,
  closing labels, POS tags: ``NP``, ``/NP``, ``PRP$``) becomes one piece, passed to
  sentencepiece as a user-defined symbol with the word-boundary mark (``▁NP``), so that a
  linearized tree is exactly one piece per token. BPE alone split every closing label in two
  (``▁/`` ``NP``: 1.31 pieces per tree token on the NLTK WSJ sample). The cost: a
  user-defined symbol is matched wherever a word starts with it, so ``Smith`` becomes
  ``▁S`` ``mith`` (1.2% of the sample's source words; their total pieces grew by 0.04%).
  The symbols get the ids right after the special ones (``FIRST_SYMBOL_ID`` ...), so the
  decoder's vocabulary can be just them (``tasks.train.target_vocab_size``).

A tokenizer a team brings (``model_file``) is taken as it is, never retrained: ``given_model``
checks a sentencepiece model's special ids and size; with subword-nmt, ``given_codes`` checks
the codes and ``numbered`` gives each piece of the vocabulary file an id, as ``train`` numbers
the pieces of a sample.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq

from corpora import CorpusError
from transformer_core.config_checks import OMITTED_AT_DEFAULT, ConfigError
from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "MODEL_TYPES",
    "NORMALIZATION",
    "SubwordModel",
    "TokenizerConfig",
    "given_codes",
    "given_model",
    "learn_codes",
    "numbered",
    "sample_sentences",
    "target_tokens",
    "train",
]

NORMALIZATION = "identity"
MODEL_TYPES = {"bpe": "bpe", "wordpiece": "unigram", "subword-nmt": "word"}
"""Our kind names -> sentencepiece model types."""
WORD_MARK = "\u2581"
"""sentencepiece's word-boundary mark, which starts every piece that starts a word."""
FIRST_SYMBOL_ID = max(PAD_ID, UNK_ID, BOS_ID, EOS_ID) + 1
"""The id of the first target symbol: sentencepiece numbers them right after the special ids."""


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """The sentencepiece model."""

    kind: Literal["bpe", "wordpiece", "subword-nmt"] = "bpe"
    """bpe: joint BPE (En-De); wordpiece: sentencepiece unigram, the open stand-in for GNMT
    word-pieces; subword-nmt: subword-nmt's joint BPE of ``merges`` merges (fairseq's recipes)."""
    vocab_size: int = 37000
    """Vocabulary size (37,000 for En-De BPE, 32,000 for En-Fr word-pieces); with subword-nmt,
    the most pieces the merges may make (its vocabulary is every piece of the sample)."""
    merges: int | None = None
    """subword-nmt's number of merges (``learn-bpe -s``); only, and always, with that kind."""
    sample_size: int = 2_000_000
    """Sentences sampled (seeded) from the clean corpus to train on."""
    threads: int = 2
    """Training threads."""
    character_coverage: float = 1.0
    """Share of characters covered by the model."""
    target_symbols: bool = False
    """Every distinct token of the training targets is one piece (parsing: labels and tags; a
    closed set)."""
    lowercase: bool = False
    """Lowercase all text before the subword model (``corpora.pretokenize``; the case is not
    restored)."""
    moses: bool = False
    """Moses-tokenize all text before the subword model, detokenize the model's output
    (``corpora.pretokenize``)."""
    model_file: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    """A tokenizer a team brings, used as it is instead of training one (a path relative to
    where ``tfm`` runs): a sentencepiece model (``.model``; kind bpe or wordpiece) with pad 0,
    unk 1, bos 2, eos 3; or, with kind subword-nmt, subword-nmt's BPE codes (and
    ``vocab_file``). Either has exactly ``vocab_size`` pieces; lowercase and moses apply
    before it, the sample's keys do not."""
    vocab_file: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    """With kind subword-nmt and ``model_file`` (its codes): the vocabulary, a ``piece count``
    line per piece (``subword-nmt get-vocab``'s, fairseq's ``dict.<lang>.txt``); each piece gets
    an id after the 4 special ones, a piece not in it is ``<unk>``."""

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ConfigError("vocab_size", f"{self.vocab_size} is too small")
        if self.model_file is not None:
            self._check_given()
        elif (self.kind == "subword-nmt") != (self.merges is not None):
            raise ConfigError("merges", "is set with kind: subword-nmt, and only then")
        if self.merges is not None and self.merges < 1:
            raise ConfigError("merges", f"{self.merges} is too few")
        if self.kind == "subword-nmt" and self.target_symbols:
            raise ConfigError("target_symbols", "needs kind bpe or wordpiece, not subword-nmt")
        if self.vocab_file is not None and (self.model_file is None or self.kind != "subword-nmt"):
            raise ConfigError(
                "vocab_file", "goes with kind: subword-nmt and model_file (its codes)"
            )

    def _check_given(self) -> None:
        """The rules of ``model_file``: nothing is trained, so no training-only key."""
        if self.merges is not None:
            raise ConfigError("merges", "is not set with model_file: the codes hold the merges")
        if self.target_symbols:
            raise ConfigError("target_symbols", "is for a trained model, not model_file")
        if self.kind == "subword-nmt" and self.vocab_file is None:
            raise ConfigError(
                "vocab_file",
                "is needed with kind: subword-nmt and model_file: the codes' vocabulary "
                "(subword-nmt get-vocab's, or fairseq's dict.txt)",
            )

    def with_absolute_files(self) -> TokenizerConfig:
        """This with ``model_file`` and ``vocab_file`` made absolute (from the CWD, where
        ``tfm`` runs)."""
        return replace(
            self,
            model_file=_absolute(self.model_file),
            vocab_file=_absolute(self.vocab_file),
        )


def _absolute(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def sample_sentences(
    files: Sequence[Path],
    sample_size: int,
    seed: int,
    prepare: Callable[[list[str], int], list[str]] | None = None,
) -> Iterator[str]:
    """A seeded sample of ``sample_size`` sentences from both sides of the (src, tgt) Parquet
    ``files``, in corpus order (all of them if there are fewer), each passed through
    ``prepare(texts, side)`` (side 0 source, 1 target; ``Pretokenizer.prepare``) if given."""
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    total = 2 * rows  # sentence 2*i is row i's source, 2*i+1 its target
    if sample_size >= total:
        chosen = None
    else:
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(total, size=sample_size, replace=False))
    offset = 0
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=["src", "tgt"]):
            src, tgt = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            n = len(src)
            if chosen is None:
                if prepare:
                    src, tgt = prepare(src, 0), prepare(tgt, 1)
                for s, t in zip(src, tgt, strict=True):
                    yield s
                    yield t
            else:
                lo, hi = np.searchsorted(chosen, [2 * offset, 2 * (offset + n)])
                for k in chosen[lo:hi].tolist():
                    row, side = divmod(k - 2 * offset, 2)
                    text = tgt[row] if side else src[row]
                    yield prepare([text], side)[0] if prepare else text
            offset += n


@dataclass(frozen=True)
class SubwordModel:
    """A trained sentencepiece model, serialised, and what it was trained on."""

    proto: bytes
    """The model file's bytes (``spm.model``)."""
    sentences: int
    """Non-empty sentences it was trained on."""

    def vocab_listing(self) -> str:
        """sentencepiece's two-column ``piece<TAB>score`` listing, for people to read."""
        sp = self._processor()
        return "".join(
            f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())
        )

    def _processor(self) -> Any:
        import sentencepiece as spm

        return spm.SentencePieceProcessor(model_proto=self.proto)


def target_tokens(
    files: Sequence[Path],
    texts: Sequence[Path] = (),
    tokens_of: Callable[[str], Iterable[str]] = str.split,
) -> list[str]:
    """The distinct target tokens of the ``tgt`` column of the Parquet ``files`` and of the
    plain-text ``texts`` (dev and test targets: a label only they hold must still be one piece
    and inside the decoder's vocabulary), most frequent first, ties in code-point order: the
    symbols of ``target_symbols``. ``tokens_of`` picks a target's tokens (parsing's ``words``
    form leaves its words out); by default every whitespace token."""
    counts: dict[str, int] = {}

    def add(text: str) -> None:
        for token in tokens_of(text):
            counts[token] = counts.get(token, 0) + 1

    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=["tgt"]):
            for text in batch.column(0).to_pylist():
                add(text)
    for path in texts:
        with open(path, encoding="utf-8") as f:
            for line in f:
                add(line)
    return sorted(counts, key=lambda t: (-counts[t], t))


def given_model(path: Path, vocab_size: int) -> SubwordModel:
    """The sentencepiece model file ``path`` (``tokenizer.model_file``) as it is, checked: a
    model with the pipeline's special ids and ``vocab_size`` pieces, else a one-line
    CorpusError naming the key and the file."""
    import sentencepiece as spm

    key, path = "tokenizer.model_file", Path(path)
    if not path.is_file():
        raise CorpusError(f"{key}: {path} does not exist")
    proto = path.read_bytes()
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError:
        raise CorpusError(
            f"{key}: {path} is not a sentencepiece model (subword-nmt codes take "
            "kind: subword-nmt and a vocab_file)"
        ) from None
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    needed = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    if ids != needed:
        raise CorpusError(
            f"{key}: {path} has the special ids (pad, unk, bos, eos) {ids} (-1: none); the "
            f"model needs {needed}: train it with --pad_id={PAD_ID} --unk_id={UNK_ID} "
            f"--bos_id={BOS_ID} --eos_id={EOS_ID}"
        )
    if sp.get_piece_size() != vocab_size:
        raise CorpusError(
            f"tokenizer.vocab_size: the config says {vocab_size} but {key} {path} has "
            f"{sp.get_piece_size()} pieces: set tokenizer.vocab_size: {sp.get_piece_size()}"
        )
    return SubwordModel(proto, 0)


def given_codes(path: Path) -> str:
    """The text of the subword-nmt codes file ``path`` (``tokenizer.model_file``), checked:
    ``learn-bpe``'s lines, a pair each after its ``#version`` line."""
    key, path = "tokenizer.model_file", Path(path)
    if not path.is_file():
        raise CorpusError(f"{key}: {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        text = "\0"
    lines = [line for line in text.splitlines() if not line.startswith("#version")]
    bad = next((n for n, line in enumerate(lines, 1) if len(line.split(" ")) != 2), None)
    if not lines or bad is not None:
        raise CorpusError(
            f"{key}: {path} is not subword-nmt codes (learn-bpe's 'left right' lines)"
        )
    return text


def numbered(symbols: Sequence[str], config: TokenizerConfig) -> SubwordModel:
    """A ``word`` model whose pieces are the special ids and exactly ``symbols`` (a vocabulary
    file's, ``tokenizer.vocab_file``), which must be ``config.vocab_size`` pieces in all."""
    key = f"tokenizer.vocab_file {config.vocab_file}"
    if len(symbols) + FIRST_SYMBOL_ID != config.vocab_size:
        raise CorpusError(
            f"tokenizer.vocab_size: the config says {config.vocab_size} but {key} has "
            f"{len(symbols)} pieces and {FIRST_SYMBOL_ID} special ids: set tokenizer.vocab_size: "
            f"{len(symbols) + FIRST_SYMBOL_ID}"
        )
    if any(WORD_MARK in s or not s.strip() or s != s.strip() for s in symbols):
        raise CorpusError(f"{key}: a piece holds a space or {WORD_MARK!r}")
    model = train(iter(symbols), replace(config, kind="subword-nmt", character_coverage=1.0))
    if model._processor().get_piece_size() != config.vocab_size:  # a piece listed twice
        raise CorpusError(f"{key}: its {len(symbols)} pieces are not all distinct")
    return model


def learn_codes(sentences: Iterable[str], merges: int) -> str:
    """subword-nmt's joint BPE codes (``learn-bpe -s merges``) of pretokenized ``sentences``."""
    from subword_nmt.learn_bpe import learn_bpe

    codes = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):  # its "no pair has frequency >= 2" note
        learn_bpe(io.StringIO("\n".join(sentences)), codes, merges, min_frequency=2)
    return codes.getvalue()


def train(
    sentences: Iterable[str], config: TokenizerConfig, symbols: Sequence[str] = ()
) -> SubwordModel:
    """Train a ``config.kind`` model of exactly ``config.vocab_size`` pieces on ``sentences``;
    each of ``symbols`` (whole words, e.g. ``target_tokens``) becomes one piece of its own. With
    subword-nmt the ``sentences`` are its pieces already, and each distinct one gets an id."""
    import sentencepiece as spm

    if len(symbols) >= config.vocab_size:
        raise CorpusError(
            f"tokenizer.vocab_size: {config.vocab_size} pieces cannot hold the {len(symbols)} "
            "target tokens of tokenizer.target_symbols (is the target side a closed set?)"
        )

    count, numbers_pieces = 0, config.kind == "subword-nmt"  # the sentences are BPE pieces already
    pieces: set[str] = set()

    def counted() -> Iterator[str]:
        nonlocal count
        for s in sentences:
            if s:
                count += 1
                if numbers_pieces:
                    pieces.update(s.split())
                yield s

    # model_writer, not model_prefix: the model would record the (temporary) prefix path, and
    # two runs of the same config would differ in that one field.
    model = io.BytesIO()
    try:
        with open(os.devnull, "w") as logstream:
            spm.SentencePieceTrainer.train(
                sentence_iterator=counted(),
                model_writer=model,
                model_type=MODEL_TYPES[config.kind],
                vocab_size=config.vocab_size,
                character_coverage=config.character_coverage,
                num_threads=config.threads,
                normalization_rule_name=NORMALIZATION,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                input_sentence_size=0,
                shuffle_input_sentence=False,
                hard_vocab_limit=not numbers_pieces,
                user_defined_symbols=[WORD_MARK + s for s in symbols],
                logstream=logstream,
            )
    except RuntimeError as exc:
        message = str(exc)
        limit = re.search(r"<= (\d+)", message)
        if "ocab" in message and ("too" in message or limit):
            supported = f" (at most {limit.group(1)} for this sample)" if limit else ""
            raise CorpusError(
                f"tokenizer.vocab_size: {config.vocab_size} is more pieces than the "
                f"{count} sampled sentences support{supported}; lower it or use more data"
            ) from None
        raise CorpusError(f"sentencepiece training failed: {message}") from None
    if numbers_pieces and len(pieces) + FIRST_SYMBOL_ID > config.vocab_size:
        raise CorpusError(
            f"tokenizer.vocab_size: {config.vocab_size} cannot hold the {len(pieces)} pieces "
            f"that tokenizer.merges {config.merges} make (and {FIRST_SYMBOL_ID} special ids); "
            "raise it"
        )
    return SubwordModel(model.getvalue(), count)
