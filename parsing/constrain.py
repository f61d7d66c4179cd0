"""The token classes that constrained parsing needs (``transformer_core.constraints``), read
from a tokenizer's vocabulary: which pieces open a constituent, close one, or are a leaf.

Only whole target tokens take part, so the tokenizer must hold each as one piece
(``tokenizer.target_symbols``: ``▁NP``, ``▁/NP``, ``▁NNP``); every other piece
(word pieces of the source side, fragments) is never allowed in a constrained output.

In the words form a leaf is the word's own pieces, copied from the source, and then its tag.

In the t2t and words forms the leaves also follow the words on punctuation, as repair's
``punct_tag`` does afterwards: a punctuation word (``,`` ``.`` ``--`` ````` ...) gets its
punctuation tag, and no other word gets one of the tags EVALB deletes (``'``, a possessive or a
quote, gets either).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from parsing.linearize import (
    DELETED_PUNCT,
    FORMS,
    PHRASE_LABELS,
    POS_TAGS,
    PUNCT_WORDS,
    VINYALS_LEAF,
)

if TYPE_CHECKING:  # imported where it is used: reading trees needs no torch
    from transformer_core.constraints import BracketVocab

__all__ = ["WORD_MARK", "token_classes", "bracket_vocab"]

WORD_MARK = "\u2581"
"""sentencepiece's word-boundary mark, which starts a piece that starts a word."""


def token_classes(pieces: Sequence[str], form: str) -> dict[int, tuple[str, str]]:
    """Piece id -> (``open`` | ``close`` | ``leaf``, label) for the pieces that are one whole
    target token of ``form`` (t2t: a phrase label, or a token whose ``/`` close is also a
    piece, opens; ``/X`` closes; a POS tag is a leaf. vinyals: ``(X``, ``)X``, ``XX``. words:
    ``(X``, ``)X``, a POS tag)."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    words = {i: p[1:] for i, p in enumerate(pieces) if p.startswith(WORD_MARK) and len(p) > 1}
    present = set(words.values())
    classes: dict[int, tuple[str, str]] = {}
    for i, tok in words.items():
        if form != "t2t":
            if tok[0] == "(" and len(tok) > 1:
                classes[i] = ("open", tok[1:])
            elif tok[0] == ")" and len(tok) > 1:
                classes[i] = ("close", tok[1:])
            elif (tok == VINYALS_LEAF) if form == "vinyals" else (tok in POS_TAGS):
                classes[i] = ("leaf", tok)
        elif tok.startswith("/") and len(tok) > 1:
            classes[i] = ("close", tok[1:])
        elif tok in POS_TAGS:
            classes[i] = ("leaf", tok)
        elif tok in PHRASE_LABELS or "/" + tok in present:
            classes[i] = ("open", tok)
    return classes


class Pieces(Protocol):
    """What ``bracket_vocab`` reads of a sentencepiece processor."""

    def id_to_piece(self, id: int) -> str: ...
    def get_piece_size(self) -> int: ...
    def is_control(self, id: int) -> bool: ...
    def eos_id(self) -> int: ...
    def pad_id(self) -> int: ...


class PieceTokenizer(Protocol):
    """A ``serving.tokenizer.Tokenizer`` as ``bracket_vocab`` reads it (parsing imports no
    serving)."""

    @property
    def sp(self) -> Pieces: ...
    @property
    def model_file(self) -> Path: ...


def bracket_vocab(
    tokenizer: PieceTokenizer, form: str, tgt_vocab_size: int | None = None
) -> BracketVocab:
    """A ``BracketVocab`` for the pieces of ``tokenizer``; for a decoder whose vocabulary is
    the first ``tgt_vocab_size`` ids, if given."""
    import torch

    from transformer_core.constraints import BracketVocab

    sp = tokenizer.sp
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    classes = token_classes(pieces, form)
    if not any(kind == "close" for kind, _ in classes.values()):
        raise ValueError(
            f"{tokenizer.model_file}: no closing label is one piece (e.g. {WORD_MARK}/NP), so "
            "parsing.constrained cannot follow the brackets; train the tokenizer with "
            "tokenizer.target_symbols: true"
        )
    labels: dict[str, int] = {}
    V = len(pieces)
    opens = torch.full((V,), -1, dtype=torch.long)
    closes = torch.full((V,), -1, dtype=torch.long)
    leaves = torch.zeros(V, dtype=torch.bool)
    for i, (kind, label) in classes.items():
        if kind == "leaf":
            leaves[i] = True
        else:
            (opens if kind == "open" else closes)[i] = labels.setdefault(label, len(labels))
    word_starts = torch.tensor(
        [p.startswith(WORD_MARK) and not sp.is_control(i) for i, p in enumerate(pieces)]
    )
    T = tgt_vocab_size or V
    if form == "words" and T != V:
        raise ValueError(
            f"the words form copies source pieces into the target: the decoder needs the joint "
            f"vocabulary ({V} ids), not {T}"
        )
    leaf_class = word_class = None
    if form != "vinyals":
        tag_class = {tag: c for c, tag in enumerate(sorted(DELETED_PUNCT), start=1)}
        leaf_class = torch.zeros(V, dtype=torch.long)
        word_class = torch.zeros(V, dtype=torch.long)
        for i, (kind, label) in classes.items():
            if kind == "leaf" and label in tag_class:
                leaf_class[i] = tag_class[label]
        for i, piece in enumerate(pieces):
            word = piece[1:] if piece.startswith(WORD_MARK) else None
            if word == "'":
                word_class[i] = -1  # a possessive (POS) or a closing quote ('')
            elif word in PUNCT_WORDS:
                word_class[i] = tag_class[PUNCT_WORDS[word]]
        leaf_class = leaf_class[:T]
    return BracketVocab(
        opens[:T],
        closes[:T],
        leaves[:T],
        word_starts,
        sp.eos_id(),
        leaf_class=leaf_class,
        word_class=word_class,
        copy_words=form == "words",
        pad_id=sp.pad_id(),
    )
