"""A fairseq dictionary's ids as ours: which fairseq row each of our ids takes.

fairseq numbers a joined dictionary (``dict.<lang>.txt``: ``symbol count`` lines) after four
specials: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, then the file's symbols in file order
(``madeupwordNNNN`` padding included: ``fairseq-preprocess`` writes it into the file). Ours:
``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3, then the pieces (``docs/contracts.md``).

The fairseq import (``tasks.fairseq_import``) writes the dictionary's symbols as the pieces of
a ``tokenizer.kind: subword-nmt`` folder, each piece the id of its symbol (a piece the
dictionary lacks is ``<unk>``, as in fairseq's ``Dictionary.encode_line``); ``vocabulary``
reads that folder's pieces back against the dictionary.

``Vocabulary`` says where each of our ids was in fairseq's: ``outputs`` is a bijection (the
pre-softmax projection's rows, so every logit is fairseq's, column for column), ``inputs`` the
same but for ``<s>``: fairseq's decoder starts from ``</s>``, ours from ``<s>``, so our ``<s>``
embedding is fairseq's ``</s>`` row.

Hand-written: reading ``dict.txt`` (a ``symbol count`` line each) is all of fairseq's
``Dictionary`` this needs, and fairseq is no dependency of ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer_core.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from weight_adapters import WeightsError

__all__ = ["SPECIALS", "Vocabulary", "dictionary_file", "read_dictionary", "vocabulary"]

SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
"""fairseq's ``Dictionary``: its special symbols and their ids, before the file's symbols."""
_OURS = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
_MARK = "\u2581"
"""sentencepiece's word-boundary mark: a ``word`` model's piece is the mark and the word."""


@dataclass(frozen=True)
class Vocabulary:
    """Our ids in fairseq's: ``outputs[i]`` is the fairseq id of our id i (a bijection);
    ``inputs`` is the same but our ``<s>`` takes fairseq's ``</s>`` (its decoder's start)."""

    outputs: list[int]
    inputs: list[int]


def dictionary_file(folder: Path, languages: tuple[str, str]) -> Path:
    """``folder``'s one joined dictionary: ``dict.<src>.txt``, the same symbols as
    ``dict.<tgt>.txt`` (our tokenizer folder holds one vocabulary for both sides)."""
    files = [Path(folder) / f"dict.{lang}.txt" for lang in languages]
    for path in files:
        if not path.is_file():
            raise WeightsError(f"{path} does not exist (--dict names the folder that holds it)")
    if read_dictionary(files[0]) != read_dictionary(files[1]):
        raise WeightsError(
            f"{files[0]} and {files[1]} differ: only a joined dictionary "
            "(fairseq-preprocess --joined-dictionary) maps onto one tokenizer folder"
        )
    return files[0]


def read_dictionary(path: Path) -> list[str]:
    """The symbols of fairseq's ``dict.txt`` in file order (their ids are 4, 5, ...)."""
    symbols: list[str] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        symbol, _, count = line.rstrip().rpartition(" ")
        if count == "#fairseq:overwrite":
            raise WeightsError(f"{path}:{n}: #fairseq:overwrite entries cannot be imported")
        if not symbol or not count.isdigit():
            raise WeightsError(f"{path}:{n}: not a fairseq dictionary line ('<symbol> <count>')")
        symbols.append(symbol)
    seen = set(SPECIALS)
    for n, symbol in enumerate(symbols, 1):
        if symbol in seen:
            raise WeightsError(f"{path}:{n}: symbol {symbol!r} appears twice")
        seen.add(symbol)
    return symbols


def vocabulary(pieces: Sequence[str], symbols: Sequence[str]) -> Vocabulary:
    """Where each of our ``pieces`` (sentencepiece's, in id order) is in fairseq's dictionary."""
    fairseq = {symbol: i for i, symbol in enumerate(symbols, len(SPECIALS))}
    words = [piece.removeprefix(_MARK) for piece in pieces[len(_OURS) :]]
    if sorted(words) != sorted(symbols):  # a symbol holding a space or the mark cannot be a piece
        lost = sorted(set(symbols) ^ set(words))
        raise WeightsError(
            f"the dictionary's symbols are not one sentencepiece piece each: {len(lost)} "
            f"differ, e.g. {lost[:3]}"
        )
    outputs = [SPECIALS[_OURS[i]] for i in range(len(_OURS))] + [fairseq[w] for w in words]
    inputs = list(outputs)
    inputs[BOS_ID] = SPECIALS["</s>"]
    return Vocabulary(outputs, inputs)
