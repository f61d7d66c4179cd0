"""Subword models: a joint sentencepiece model trained on a seeded sample of a clean corpus.

``kind: bpe`` is the paper's byte-pair encoding (37,000 shared pieces for En-De).
``kind: wordpiece`` is sentencepiece's unigram model: GNMT's word-piece model (the paper's En-Fr
vocabulary, 32,000) was never released, and the unigram model is its open stand-in.

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
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq

from corpora import CorpusError
from transformer_core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ConfigError

__all__ = ["MODEL_TYPES", "NORMALIZATION", "SubwordModel", "TokenizerConfig", "sample_sentences", "train"]

NORMALIZATION = "identity"
MODEL_TYPES = {"bpe": "bpe", "wordpiece": "unigram"}
"""Our kind names -> sentencepiece model types."""


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """The sentencepiece model."""

    kind: Literal["bpe", "wordpiece"] = "bpe"
    """bpe: joint BPE (En-De); wordpiece: sentencepiece unigram, the open stand-in for GNMT word-pieces."""
    vocab_size: int = 37000
    """Vocabulary size (37,000 for En-De BPE, 32,000 for En-Fr word-pieces)."""
    sample_size: int = 2_000_000
    """Sentences sampled (seeded) from the clean corpus to train on."""
    threads: int = 2
    """Training threads."""
    character_coverage: float = 1.0
    """Share of characters covered by the model."""

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ConfigError("vocab_size", f"{self.vocab_size} is too small")


def sample_sentences(files: Sequence[Path], sample_size: int, seed: int) -> Iterator[str]:
    """A seeded sample of ``sample_size`` sentences from both sides of the (src, tgt) Parquet
    ``files``, in corpus order (all of them if there are fewer)."""
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
                for s, t in zip(src, tgt, strict=True):
                    yield s
                    yield t
            else:
                lo, hi = np.searchsorted(chosen, [2 * offset, 2 * (offset + n)])
                for k in chosen[lo:hi].tolist():
                    row, side = divmod(k - 2 * offset, 2)
                    yield tgt[row] if side else src[row]
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
        return "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))

    def _processor(self) -> Any:
        import sentencepiece as spm

        return spm.SentencePieceProcessor(model_proto=self.proto)


def train(sentences: Iterable[str], config: TokenizerConfig) -> SubwordModel:
    """Train a ``config.kind`` model of exactly ``config.vocab_size`` pieces on ``sentences``."""
    import sentencepiece as spm

    count = 0

    def counted() -> Iterator[str]:
        nonlocal count
        for s in sentences:
            if s:
                count += 1
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
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                input_sentence_size=0,
                shuffle_input_sentence=False,
                hard_vocab_limit=True,
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
    return SubwordModel(model.getvalue(), count)
