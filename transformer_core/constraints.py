"""Constrained decoding for bracketed targets: every hypothesis of a beam search stays a
well-formed tree over exactly as many leaves as its source has words (linearized parsing).

The target vocabulary is described by token classes (``BracketVocab``): tokens that open a
constituent with a label, tokens that close one with a label, and leaf tokens (POS tags, or
Vinyals' ``XX``). At each step ``BracketState.allowed`` says which tokens may come next:

- a leaf, while fewer leaves than words were emitted, inside an open constituent; with leaf
  classes (``leaf_class``, ``word_class``), only a leaf of the next word's class (parsing: a
  punctuation word takes its punctuation tag, and no other word takes one);
- an opening token as the very first token (the root) or inside an open constituent, while a
  word is left for it;
- the closing token of the innermost open constituent only (its label), once that constituent
  holds a leaf, and for the root only once every word has its leaf;
- EOS only after the root has closed (then nothing else);
- and nothing that could not still finish within the output length limit.

So a hypothesis can always go on, and every finished one is a tree with one leaf per word.

With ``copy_words`` (parsing's ``words`` form) each leaf is written as the word's own source
pieces followed by its tag: where a leaf may come, the next word's first piece is allowed, and
once it is chosen the rest of its pieces are forced, then one tag. The decoder picks the
structure and the tags; the words are never its to choose.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BracketVocab", "BracketState", "TreeConstraint"]


@dataclass(frozen=True)
class BracketVocab:
    """Token classes of a bracketed target vocabulary (all tensors (V,), on one device)."""

    opens: Tensor
    """long: the label class of a token that opens a constituent, -1 for other tokens."""
    closes: Tensor
    """long: the label class of a token that closes a constituent, -1 for other tokens."""
    leaves: Tensor
    """bool: tokens that are one leaf (one word's slot)."""
    word_starts: Tensor
    """bool: source tokens that begin a word (counted to know how many leaves a sentence has)."""
    eos_id: int
    """End of sentence: allowed once the tree is complete."""
    max_depth: int = 128
    """Most constituents open at once."""
    leaf_class: Tensor | None = None
    """long (V,): the class of each leaf token (0: an ordinary one); None: no classes."""
    word_class: Tensor | None = None
    """long (V_src,): the leaf class a one-piece source word demands (0: an ordinary leaf; -1:
    any leaf). A word of several pieces takes any leaf if its first piece demands a punctuation
    class (``...`` as ``.`` ``..``), else an ordinary one (``'s`` as ``'`` ``s``)."""
    copy_words: bool = False
    """Each leaf is the next source word's pieces, copied, then a leaf token (its tag)."""
    pad_id: int = 0
    """Padding of the source rows (with ``copy_words``: where a row's words end)."""

    def __post_init__(self) -> None:
        V = self.opens.numel()
        for name in ("closes", "leaves"):
            if getattr(self, name).shape != (V,):
                raise ValueError(
                    f"{name} has shape {tuple(getattr(self, name).shape)}, expected ({V},)"
                )
        if not bool((self.closes >= 0).any()):
            raise ValueError("no closing token in the vocabulary: nothing can be constrained")

    def to(self, device: torch.device | str) -> BracketVocab:
        """The same classes on ``device``."""
        return BracketVocab(
            self.opens.to(device),
            self.closes.to(device),
            self.leaves.to(device),
            self.word_starts.to(device),
            self.eos_id,
            self.max_depth,
            None if self.leaf_class is None else self.leaf_class.to(device),
            None if self.word_class is None else self.word_class.to(device),
            self.copy_words,
            self.pad_id,
        )

    def words(self, src: Tensor) -> Tensor:
        """(B,) words per source row (B, S): its word-starting tokens, at least 1."""
        starts = self.word_starts.to(src.device)
        inside = src.clamp(0, starts.numel() - 1)
        return (starts[inside] & src.lt(starts.numel())).sum(dim=1).clamp(min=1)

    def word_classes(self, src: Tensor) -> Tensor | None:
        """(B, W) the leaf class each word of the source rows (B, S) demands (-1: any), or None
        without classes. W is the most words in a row (at least 1)."""
        if self.word_class is None:
            return None
        V = self.word_starts.numel()
        inside = src.clamp(0, V - 1)
        in_vocab = src.lt(V)
        starts = self.word_starts.to(src.device)[inside] & in_vocab  # (B, S)
        piece_class = self.word_class.to(src.device)[inside].masked_fill(~in_vocab, 0)  # (B, S)
        # A word start followed by a piece that continues the word: not a one-piece word.
        word_piece = in_vocab & src.ne(self.eos_id) & src.gt(0)
        nxt = torch.zeros_like(starts)
        nxt[:, :-1] = word_piece[:, 1:] & ~starts[:, 1:]
        several = torch.where(piece_class.gt(0), -1, 0)  # "..." as "." + "..": any leaf
        piece_class = torch.where(nxt, several, piece_class)
        index = starts.long().cumsum(dim=1) - 1  # (B, S) word index of each start
        W = max(int(starts.sum(dim=1).max()), 1)
        out = torch.zeros(src.size(0), W + 1, dtype=torch.long, device=src.device)
        index = torch.where(starts, index, W)  # non-starts write to a spare column
        out.scatter_(1, index, torch.where(starts, piece_class, 0))
        return out[:, :W]


@dataclass(eq=False)
class Copying:
    """With ``copy_words``: where each of the N rows stands in copying its source's words."""

    src: Tensor
    """(N, S + 1): the next word's pieces are src[pos:]; a spare column ends every row."""
    continues: Tensor
    """(N, S + 1) bool: the piece is real and continues its word (starts none)."""
    pieces: Tensor
    """(N,): word pieces to copy in all."""
    pos: Tensor
    """(N,): the next piece to copy."""
    phase: Tensor
    """(N,): ``BracketState.FREE``, ``COPY`` or ``TAG``."""
    not_words: Tensor
    """(V,) bool: labels and EOS, which no word is (the same for every row)."""

    @classmethod
    def start(cls, vocab: BracketVocab, src: Tensor) -> Copying:
        """Nothing copied yet from the source rows ``src`` (N, S)."""
        N, device = src.size(0), src.device
        starts = vocab.word_starts.to(device)
        inside = src.clamp(0, starts.numel() - 1)
        real = src.ne(vocab.pad_id) & src.ne(vocab.eos_id) & src.lt(starts.numel())
        not_words = vocab.opens.ge(0) | vocab.closes.ge(0)
        not_words[vocab.eos_id] = True
        return cls(
            src=torch.cat([src.long(), src.new_full((N, 1), vocab.pad_id)], dim=1),
            continues=torch.cat(
                [real & ~starts[inside], torch.zeros(N, 1, dtype=torch.bool, device=device)],
                dim=1,
            ),
            pieces=real.sum(dim=1),
            pos=torch.zeros(N, dtype=torch.long, device=device),
            phase=torch.zeros(N, dtype=torch.long, device=device),
            not_words=not_words,
        )

    def next_piece(self) -> Tensor:
        """(N,): the source piece each row would copy next."""
        return self.src.gather(1, self.pos[:, None])[:, 0]

    def reorder(self, rows: Tensor) -> None:
        """Keep rows ``rows`` (N',) in that order."""
        for name in ("src", "continues", "pieces", "pos", "phase"):
            setattr(self, name, getattr(self, name).index_select(0, rows))


class BracketState:
    """Per hypothesis (N rows): the open constituents' labels, the leaves emitted, the words to
    cover and the output length limit; ``allowed`` masks the next token, ``advance`` takes it."""

    def __init__(
        self,
        vocab: BracketVocab,
        words: Tensor,
        limits: Tensor,
        word_classes: Tensor | None = None,
        src: Tensor | None = None,
    ) -> None:
        """``words`` (N,): leaves each row must emit; ``limits`` (N,): its most output tokens
        (EOS included); ``word_classes`` (N, W): the leaf class of each word (``word_classes``);
        ``src`` (N, S): each row's source ids (needed with ``vocab.copy_words``)."""
        self.vocab = vocab
        self.word_classes = word_classes
        N, device = words.numel(), words.device
        self.words = words.long()
        self.limits = limits.to(device).long()
        self.stack = torch.full((N, vocab.max_depth), -1, dtype=torch.long, device=device)
        self.depth = torch.zeros(N, dtype=torch.long, device=device)
        self.leaves = torch.zeros(N, dtype=torch.long, device=device)
        self.filled = torch.zeros(N, dtype=torch.bool, device=device)  # innermost has a leaf
        self.steps = 0  # tokens emitted so far (the same for every row)
        self.copying: Copying | None = None
        if vocab.copy_words:
            if src is None:
                raise ValueError("copy_words needs each row's source ids (src)")
            self.copying = Copying.start(vocab, src)

    FREE, COPY, TAG = 0, 1, 2
    """``copy_words`` phases: structure or a new word may come; a word's pieces are being
    copied; its tag must come."""

    def _top(self) -> Tensor:
        """(N,) label class of the innermost open constituent, -1 when none."""
        index = (self.depth - 1).clamp(min=0)[:, None]
        return torch.where(self.depth > 0, self.stack.gather(1, index)[:, 0], -1)

    def allowed(self) -> Tensor:
        """(N, V) bool: the tokens each row may emit next."""
        return self._allowed()[0]

    def _allowed(self) -> tuple[Tensor, Tensor | None]:
        """``allowed``, and with ``copy_words`` the (N,) rows where a word may start."""
        v = self.vocab
        left = self.words - self.leaves  # words still without a leaf
        # Tokens left after the next one must fit: one per missing leaf (with copy_words, its
        # pieces too), one per open constituent's close, and EOS.
        room = self.limits - (self.steps + 1)
        c = self.copying
        pieces = 0 if c is None else c.pieces - c.pos  # word pieces left to copy
        free = True if c is None else c.phase.eq(self.FREE)
        inside = self.depth > 0
        leaf_ok = inside & (left > 0) & (room >= (left - 1) + pieces + self.depth + 1)
        open_ok = (
            free
            & (inside | (self.steps == 0))
            & (left > 0)
            & (self.depth < v.max_depth)
            & (room >= left + pieces + self.depth + 2)
        )
        close_ok = free & inside & self.filled & ((self.depth > 1) | (left == 0))
        eos_ok = free & ~inside & (self.steps > 0) & (left == 0)
        top = self._top()
        leaves = v.leaves[None, :]  # (1, V)
        if self.word_classes is not None and v.leaf_class is not None:
            at = self.leaves.clamp(max=self.word_classes.size(1) - 1)[:, None]
            demanded = self.word_classes.gather(1, at)  # (N, 1)
            leaves = leaves & (demanded.lt(0) | v.leaf_class[None, :].eq(demanded))  # (N, V)
        # With copy_words a leaf starts with the next word's first piece; its tag comes after.
        word_starts = None if c is None else leaf_ok & free
        tag_ok = leaf_ok if c is None else c.phase.eq(self.TAG)
        allowed = (
            (tag_ok[:, None] & leaves)
            | (open_ok[:, None] & v.opens.ge(0)[None, :])
            | (close_ok[:, None] & v.closes.ge(0)[None, :] & v.closes[None, :].eq(top[:, None]))
        )
        if c is not None and word_starts is not None:
            copy = (word_starts | c.phase.eq(self.COPY)).nonzero().view(-1)
            allowed[copy, c.next_piece()[copy]] = True
        allowed[:, v.eos_id] = eos_ok
        return allowed, word_starts

    def mask(self, log_probs: Tensor) -> Tensor:
        """``log_probs`` (N, V) with the disallowed tokens set to -inf, in place. With
        ``copy_words`` a copied piece is scored as the event it stands for: the first piece of a
        word by the model's probability that some word comes next (all tokens but labels and
        EOS), the word's other pieces by 1 (log 0). The words are given, not predicted: scoring
        the one piece would make a barely trained model, which cannot copy yet, open labels
        until the length limit forces the words out."""
        allowed, word_starts = self._allowed()
        c = self.copying
        if c is not None and word_starts is not None:
            some_word = log_probs.masked_fill(c.not_words[None, :], float("-inf"))
            score = torch.where(word_starts, some_word.logsumexp(dim=1), 0.0)
            copied = (word_starts | c.phase.eq(self.COPY)).nonzero().view(-1)
            log_probs[copied, c.next_piece()[copied]] = score[copied]
        return log_probs.masked_fill_(~allowed, float("-inf"))

    def reorder(self, rows: Tensor) -> None:
        """Keep rows ``rows`` (N',) in that order (beams reordered, finished ones dropped)."""
        names = ("words", "limits", "stack", "depth", "leaves", "filled", "word_classes")
        for name in names:
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).index_select(0, rows))
        if self.copying is not None:
            self.copying.reorder(rows)

    def advance(self, tokens: Tensor) -> None:
        """Take one token (N,) per row."""
        v = self.vocab
        label_open = v.opens[tokens]  # (N,)
        is_open = label_open.ge(0)
        is_close = v.closes[tokens].ge(0) & ~is_open
        is_leaf = v.leaves[tokens]
        c = self.copying
        if c is not None:  # the phase tells a copied piece from a label or a tag
            copying = c.phase.eq(self.COPY) | (c.phase.eq(self.FREE) & tokens.eq(c.next_piece()))
            is_open = is_open & c.phase.eq(self.FREE) & ~copying
            is_close = is_close & c.phase.eq(self.FREE) & ~copying
            is_leaf = c.phase.eq(self.TAG)
            c.pos = c.pos + copying.long()
            more = c.continues.gather(1, c.pos[:, None])[:, 0]  # the word goes on
            c.phase = torch.where(
                copying,
                torch.where(more, self.COPY, self.TAG),
                torch.where(is_leaf, self.FREE, c.phase),
            )
        rows = torch.arange(tokens.numel(), device=tokens.device)
        at = self.depth.clamp(max=v.max_depth - 1)
        self.stack[rows[is_open], at[is_open]] = label_open[is_open]
        self.depth = self.depth + is_open.long() - is_close.long()
        self.leaves = self.leaves + is_leaf.long()
        # A leaf fills every open constituent; a closed child (which held one) fills its parent.
        self.filled = torch.where(is_open, False, self.filled | is_leaf | is_close)
        self.steps += 1


class TreeConstraint:
    """The tree constraint as a beam-search step processor
    (``transformer_core.search_settings.StepProcessor``): one ``BracketState`` row per beam."""

    def __init__(self, vocab: BracketVocab) -> None:
        self.vocab = vocab
        self.beam_size = 1
        self.state: BracketState | None = None

    def begin(self, src: Tensor, limits: Tensor, beam_size: int) -> None:
        """The state of every beam (B*k rows) of the sources (B, S); ``limits`` (B,)."""
        vocab = self.vocab.to(src.device)
        per_beam = torch.arange(src.size(0), device=src.device).repeat_interleave(beam_size)
        classes = vocab.word_classes(src)
        self.beam_size = beam_size
        self.state = BracketState(
            vocab,
            vocab.words(src)[per_beam],
            limits.to(src.device)[per_beam],
            None if classes is None else classes[per_beam],
            src[per_beam] if vocab.copy_words else None,
        )

    def mask(self, log_probs: Tensor, first: bool) -> None:
        """Disallowed tokens get -inf, in place. ``first``: one row per sentence (its first
        beam); only the root's opening tokens may come, so no copied piece is rescored."""
        if self.state is None:
            raise RuntimeError("TreeConstraint.mask before begin")
        if first:
            log_probs.masked_fill_(~self.state.allowed()[:: self.beam_size], float("-inf"))
        else:
            self.state.mask(log_probs)

    def advance(self, rows: Tensor, tokens: Tensor) -> None:
        """Keep beams ``rows`` (N',) in that order, then take one token (N',) per beam."""
        if self.state is None:
            raise RuntimeError("TreeConstraint.advance before begin")
        self.state.reorder(rows)
        self.state.advance(tokens)
