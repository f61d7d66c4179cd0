"""Stage 3, tokenizer: a joint sentencepiece model trained on a seeded sample of the clean corpus.

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
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from tasks.artifacts import StageError, run_stage
from transformer_core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

__all__ = ["Tokenizer", "load", "train", "sample_sentences", "run", "stage_config", "MODEL_FILE", "NORMALIZATION"]

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
NORMALIZATION = "identity"
_MODEL_TYPES = {"bpe": "bpe", "wordpiece": "unigram"}


class Tokenizer:
    """A trained sentencepiece model with the pipeline's id conventions."""

    def __init__(self, model_file: Path):
        import sentencepiece as spm

        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise StageError(f"{model_file}: special ids (pad, unk, bos, eos) are {ids}, "
                             f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}")

    @property
    def vocab_size(self) -> int:
        """Number of pieces, specials included."""
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` followed by EOS."""
        return self.sp.encode(text) + [EOS_ID]

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """``encode`` for many texts at once."""
        return [ids + [EOS_ID] for ids in self.sp.encode(list(texts), num_threads=num_threads)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS; BOS and PAD are dropped."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (BOS_ID, PAD_ID):
                pieces.append(i)
        return self.sp.decode(pieces)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """``decode`` for many id lists."""
        return [self.decode(ids) for ids in batch]


def load(folder: Path) -> Tokenizer:
    """The tokenizer stage's model from its output folder."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise StageError(f"tokenizer: {path} does not exist (run `tfm stage tokenizer` first)")
    return Tokenizer(path)


def _train_files(clean: Path) -> list[Path]:
    files = sorted((Path(clean) / "train").glob("*.parquet"))
    if not files:
        raise StageError(f"tokenizer: no training data in {Path(clean) / 'train'}")
    return files


def sample_sentences(clean: Path, sample_size: int, seed: int) -> Iterator[str]:
    """A seeded sample of ``sample_size`` sentences from both sides, in corpus order (all if fewer)."""
    files = _train_files(clean)
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


def train(sentences: Iterable[str], out_dir: Path, config: Any) -> dict[str, Any]:
    """Train ``out_dir/spm.model`` and ``spm.vocab`` from ``sentences`` (a TokenizerConfig)."""
    import sentencepiece as spm

    out_dir = Path(out_dir)
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
                model_type=_MODEL_TYPES[config.kind],
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
            raise StageError(
                f"tokenizer.vocab_size: {config.vocab_size} is more pieces than the "
                f"{count} sampled sentences support{supported}; lower it or use more data"
            ) from None
        raise StageError(f"tokenizer: sentencepiece training failed: {message}") from None
    (out_dir / MODEL_FILE).write_bytes(model.getvalue())
    _write_vocab(out_dir / VOCAB_FILE, model.getvalue())
    tokenizer = Tokenizer(out_dir / MODEL_FILE)
    return {
        "kind": config.kind,
        "model_type": _MODEL_TYPES[config.kind],
        "vocab_size": tokenizer.vocab_size,
        "sentences": count,
        "normalization": NORMALIZATION,
    }


def stage_config(config: Any) -> dict[str, Any]:
    """What the stage fingerprints: the tokenizer section and the seed (it picks the sample)."""
    from tasks.config import to_dict

    return {"tokenizer": to_dict(config.tokenizer), "seed": config.seed}


def _write_vocab(path: Path, model: bytes) -> None:
    """sentencepiece's two-column ``piece<TAB>score`` listing, for people to read."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    lines = (f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    path.write_text("".join(lines), encoding="utf-8")


def run(config: Any, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Run the tokenizer stage: ``inputs["clean"]`` -> ``<root>/tokenizer``."""
    clean = Path(inputs["clean"])
    tok = config.tokenizer

    def build(tmp: Path) -> dict[str, Any]:
        stats = train(sample_sentences(clean, tok.sample_size, config.seed), tmp, tok)
        log.info("tokenizer: %s, %d pieces from %d sentences", tok.kind, stats["vocab_size"], stats["sentences"])
        return stats

    return run_stage(
        "tokenizer", config.root / "tokenizer", stage_config(config), {"clean": clean}, build, force=force
    )
