"""The tokenizer a trained model reads and writes: a sentencepiece model with the pipeline's ids.

The ids are the contract between every part (docs/contracts.md): pad 0, unk 1, bos 2, eos 3;
``encode`` appends EOS, ``decode`` stops at it. Training the model is ``corpora.subwords``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from serving import ServingError
from transformer_core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["MODEL_FILE", "VOCAB_FILE", "Tokenizer", "load"]

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"


class Tokenizer:
    """A trained sentencepiece model with the pipeline's id conventions."""

    def __init__(self, model_file: Path):
        import sentencepiece as spm

        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ServingError(f"{model_file}: special ids (pad, unk, bos, eos) are {ids}, "
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


def load(folder: Path) -> Tokenizer:
    """The tokenizer in ``folder`` (the tokenizer stage's output, or a registered model's copy)."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise ServingError(f"{path} does not exist: no tokenizer in {folder} (run `tfm stage tokenizer` first)")
    return Tokenizer(path)
