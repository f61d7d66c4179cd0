"""The tokenizer a trained model reads and writes: a sentencepiece model with the pipeline's ids.

The ids are the contract between every part (docs/contracts.md): pad 0, unk 1, bos 2, eos 3;
``encode`` appends EOS, ``decode`` stops at it. Training the model is ``corpora.subwords``.
A folder that records a pretokenization (``corpora.pretokenize``: lowercase, Moses) applies it
in ``encode`` (source text by default) and undoes the Moses tokenization in ``decode``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from corpora import CorpusError
from corpora.pretokenize import CODES_FILE, Pretokenizer
from corpora.pretokenize import FILE as PRETOKENIZE_FILE
from serving import ServingError
from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["FILES", "MODEL_FILE", "VOCAB_FILE", "Tokenizer", "load"]

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
FILES = (MODEL_FILE, VOCAB_FILE, PRETOKENIZE_FILE, CODES_FILE)
"""What a tokenizer folder may hold (a copy of the folder copies these)."""


class Tokenizer:
    """A trained sentencepiece model with the pipeline's id conventions."""

    def __init__(self, model_file: Path, pretokenizer: Pretokenizer | None = None):
        import sentencepiece as spm

        self.model_file = Path(model_file)
        self.pretokenizer = pretokenizer
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ServingError(
                f"{model_file}: special ids (pad, unk, bos, eos) are {ids}, "
                f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )

    @property
    def vocab_size(self) -> int:
        """Number of pieces, specials included."""
        return self.sp.get_piece_size()

    def prepare(self, texts: Sequence[str], side: int = 0) -> list[str]:
        """``texts`` as the subword model reads them (pretokenized; side 0 source, 1 target)."""
        return self.pretokenizer.prepare(texts, side) if self.pretokenizer else list(texts)

    def encode(self, text: str, side: int = 0) -> list[int]:
        """Piece ids of ``text`` (of ``side``: 0 source, 1 target) followed by EOS."""
        return self.sp.encode(self.prepare([text], side)[0]) + [EOS_ID]

    def encode_batch(
        self, texts: Sequence[str], num_threads: int = 1, side: int = 0
    ) -> list[list[int]]:
        """``encode`` for many texts at once."""
        pieces = self.sp.encode(self.prepare(texts, side), num_threads=num_threads)
        return [ids + [EOS_ID] for ids in pieces]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS; BOS and PAD are dropped."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (BOS_ID, PAD_ID):
                pieces.append(i)
        text = self.sp.decode(pieces)
        return self.pretokenizer.restore([text])[0] if self.pretokenizer else text


def load(folder: Path) -> Tokenizer:
    """The tokenizer in ``folder`` (the tokenizer stage's output, or a registered model's copy)."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise ServingError(
            f"{path} does not exist: no tokenizer in {folder} (run `tfm stage tokenizer` first)"
        )
    try:
        pretokenizer = Pretokenizer.load(folder)
    except CorpusError as exc:
        raise ServingError(str(exc)) from exc
    return Tokenizer(path, pretokenizer)
