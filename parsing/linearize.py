"""Trees as token sequences and back: the target side of the parsing task.

Three target forms (the source is always the words joined by spaces):

- ``t2t``, tensor2tensor's, the form the paper trained on: phrase labels and POS tags are kept,
  a closing bracket carries its label, words are left out:
  ``S NP NNP NNP /NP VP VBZ NP DT NN /NP /VP . /S``.
- ``vinyals``, Vinyals & Kaiser et al. 2015 ("Grammar as a Foreign Language"): POS tags become
  ``XX``: ``(S (NP XX XX )NP (VP XX (NP XX XX )NP )VP XX )S``.
- ``words``: each word is written before its POS tag, and labels are bracketed as in
  ``vinyals``: ``(S (NP John NNP Smith NNP )NP (VP runs VBZ (NP a DT shop NN )NP )VP . . )S``.
  The decoder sees the word it is about to tag instead of counting the tags it emitted (on the
  NLTK sample that alone took greedy tagging accuracy from 22% to 77% at 1,000 steps:
  docs/parsing.md); constrained decoding writes the words itself (``parsing.constrain``).

``repair`` turns any token sequence, however broken, into a well-formed tree over the given
words, so that every hypothesis can be scored, and says what it fixed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from parsing.trees import CLOSE, LEAF, OPEN, Tree, walk

__all__ = [
    "FORMS",
    "Form",
    "FALLBACK_LABEL",
    "Repaired",
    "linearize",
    "source",
    "structure_tokens",
    "repair",
    "default_tag",
    "pairs",
    "punctuation_tag",
]

Form = Literal["t2t", "vinyals", "words"]
"""A linearized tree's form: tensor2tensor's, Vinyals & Kaiser's, or words before their tags."""
FORMS: tuple[str, ...] = get_args(Form)
VINYALS_LEAF = "XX"
FALLBACK_LABEL = "S"
"""Label of the root that repair puts over a flat or multi-rooted prediction."""

PHRASE_LABELS = frozenset(
    "ADJP ADVP CONJP FRAG INTJ LST NAC NP NX PP PRN PRT QP RRC S SBAR SBARQ SINV SQ UCP VP "
    "WHADJP WHADVP WHNP WHPP X TOP".split()
)
"""Penn Treebank phrase labels: in the t2t form, these tokens open a constituent."""
POS_TAGS = frozenset(
    "CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR RBS RP SYM TO UH "
    "VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB # $ . , : `` '' -LRB- -RRB- -LCB- -RCB- -NONE-".split()
)
"""Penn Treebank POS tags: in the t2t form, these tokens are leaves."""
_PUNCT_TAGS = {
    ",": ",", ".": ".", "?": ".", "!": ".", ":": ":", ";": ":", "--": ":", "-": ":", "...": ":",
    "``": "``", "`": "``", "''": "''", "-LRB-": "-LRB-", "-RRB-": "-RRB-", "$": "$", "#": "#",
}  # fmt: skip
_BRACKETS = ("(", ")")


def linearize(tree: Tree, form: str = "t2t") -> list[str]:
    """The target token sequence of ``tree`` in ``form`` (one of ``FORMS``)."""
    _check_form(form)
    tokens: list[str] = []
    for kind, node in walk(tree):
        if kind == LEAF:
            if form == "words" and node.word is not None:  # a leaf always has its word
                tokens.append(node.word)
            tokens.append(VINYALS_LEAF if form == "vinyals" else node.label)
        elif kind == OPEN:
            tokens.append(node.label if form == "t2t" else f"({node.label}")
        else:
            tokens.append(f"/{node.label}" if form == "t2t" else f"){node.label}")
    return tokens


def source(tree: Tree) -> str:
    """The source side: the words joined by spaces."""
    return " ".join(tree.words())


def structure_tokens(target: str, form: str) -> list[str]:
    """The tokens of a linearized ``target`` that are not words (labels, closing labels and
    tags): all of them, except in the ``words`` form."""
    _check_form(form)
    tokens = target.split()
    if form != "words":
        return tokens
    return [tokens[at] for kind, _, at in _classify_words(tokens) if kind]


# ----------------------------------------------------------------------------- back to trees


@dataclass(frozen=True)
class Repaired:
    """A tree rebuilt from a prediction, and what had to be fixed (empty when nothing)."""

    tree: Tree
    """A well-formed tree with exactly one leaf per word."""
    fixes: Mapping[str, int] = field(default_factory=dict)
    """Fix kind -> count: stray_close, label_mismatch, unclosed, missing_leaves, extra_leaves,
    punct_tag, empty_constituent, junk_token, top_level, flat."""


def default_tag(word: str) -> str:
    """The tag given to a word the prediction left out: its punctuation tag, else NN."""
    return _PUNCT_TAGS.get(word, "NN")


# The punctuation tags EVALB's COLLINS.prm deletes, and the words the treebank tags with them
# (the NLTK WSJ sample: every such word carries one, except "'", which is also POS).
DELETED_PUNCT = frozenset({",", ":", "``", "''", "."})
"""The punctuation tags EVALB (COLLINS.prm) deletes."""
PUNCT_WORDS = {w: t for w, t in _PUNCT_TAGS.items() if t in DELETED_PUNCT}
"""Punctuation words and the deleted tag each must carry."""


def punctuation_tag(word: str, tag: str) -> str:
    """``tag``, unless it contradicts the word on punctuation: a punctuation word must carry a
    punctuation tag and any other word must not. EVALB deletes words by their own tree's tags,
    so one such leaf (``.`` tagged ``NN``, ``Bush`` tagged ``:``) would make the whole sentence a
    length error; the word decides instead (``_PUNCT_TAGS``, or ``default_tag``)."""
    if word in PUNCT_WORDS:
        return tag if tag in DELETED_PUNCT else PUNCT_WORDS[word]
    if tag in DELETED_PUNCT and word != "'":
        return default_tag(word)
    return tag


class _Open:
    """A constituent still open while rebuilding."""

    __slots__ = ("label", "children")

    def __init__(self, label: str) -> None:
        self.label = label
        self.children: list[Tree] = []


def repair(
    tokens: str | Sequence[str],
    words: str | Sequence[str],
    form: str = "t2t",
    *,
    tags: Sequence[str] | None = None,
) -> Repaired:
    """A well-formed tree over ``words`` from a predicted sequence (never raises on junk), and
    the fixes it needed. ``tags`` (vinyals form only) fills the leaves instead of ``XX``.

    Rules: a close whose label differs closes the innermost open constituent anyway; a close
    with nothing open is dropped; constituents still open at the end are closed; leaves beyond
    the words are dropped; words without a leaf are attached to the last open constituent with
    ``default_tag``; constituents left empty are dropped; leaves or several constituents at the
    top are joined under one root; an empty prediction gives a flat ``S`` over the words; in the
    t2t form a tag that contradicts its word on punctuation is replaced (``punctuation_tag``).
    """
    _check_form(form)
    tokens = tokens.split() if isinstance(tokens, str) else list(tokens)
    words = words.split() if isinstance(words, str) else list(words)
    if not words:
        raise ValueError("repair needs at least one word")
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    builder = _Rebuild(words, form, tags)
    classified = (
        ((kind, label) for kind, label, _ in _classify_words(tokens))
        if form == "words"
        else _classify(tokens, form)
    )
    for kind, label in classified:
        builder.take(kind, label)
    return builder.finish()


class _Rebuild:
    """``repair``'s state: the open constituents, the leaves placed so far and the fixes."""

    def __init__(self, words: list[str], form: str, tags: Sequence[str] | None) -> None:
        self.words, self.form, self.tags = words, form, tags
        self.fixes: Counter[str] = Counter()
        self.root = _Open("")
        self.stack = [self.root]
        self.n_leaves = 0

    def take(self, kind: str | None, label: str) -> None:
        if kind is None:
            self.fixes["junk_token"] += 1
        elif kind == OPEN:
            self.stack.append(_Open(label))
        elif kind == LEAF:
            self.add_leaf(label)
        elif len(self.stack) == 1:
            self.fixes["stray_close"] += 1
        else:
            self.close(label)

    def add_leaf(self, tag: str) -> None:
        if self.n_leaves >= len(self.words):
            self.fixes["extra_leaves"] += 1
            return
        word = self.words[self.n_leaves]
        if self.form == "vinyals":
            tag = self.tags[self.n_leaves] if self.tags is not None else VINYALS_LEAF
        else:  # t2t, words
            fixed = punctuation_tag(word, tag)
            if fixed != tag:
                self.fixes["punct_tag"] += 1
                tag = fixed
        self.stack[-1].children.append(Tree(tag, word=word))
        self.n_leaves += 1

    def close(self, label: str | None) -> None:
        node = self.stack.pop()
        if label and label != node.label:
            self.fixes["label_mismatch"] += 1
        if node.children:
            self.stack[-1].children.append(Tree(node.label, tuple(node.children)))
        else:
            self.fixes["empty_constituent"] += 1

    def finish(self) -> Repaired:
        """Attach the words without a leaf, close what is open, join the top under one root."""
        words, root = self.words, self.root
        if self.n_leaves < len(words):
            self.fixes["missing_leaves"] += len(words) - self.n_leaves
            extra = [
                Tree(_missing_tag(self.form, self.tags, i, words[i]), word=words[i])
                for i in range(self.n_leaves, len(words))
            ]
            last = root.children[-1] if root.children else None
            if len(self.stack) > 1 or last is None or last.is_leaf:
                self.stack[-1].children.extend(extra)
            else:  # everything was closed: the last constituent at the top takes them
                root.children[-1] = Tree(last.label, last.children + tuple(extra))
        while len(self.stack) > 1:
            self.fixes["unclosed"] += 1
            self.close(None)
        return Repaired(_join_top(root.children, self.fixes), dict(self.fixes))


def _missing_tag(form: str, tags: Sequence[str] | None, i: int, word: str) -> str:
    if form != "vinyals":
        return default_tag(word)
    return tags[i] if tags is not None else VINYALS_LEAF


def _classify(tokens: list[str], form: str) -> Iterator[tuple[str | None, str]]:
    """(OPEN | LEAF | CLOSE | None for junk, label) per token."""
    if form == "vinyals":
        for tok in tokens:
            head, label = tok[:1], tok[1:]
            if not tok or (head in _BRACKETS and _has_bracket(label)):
                yield None, tok
            elif head == "(":
                yield (OPEN, label) if label else (None, tok)
            elif head == ")":
                yield CLOSE, label
            elif _has_bracket(tok):
                yield None, tok
            else:
                yield LEAF, VINYALS_LEAF
        return
    # t2t: a phrase label opens; so does an unknown token whose close comes later (a label this
    # table lacks). Every other token is a POS tag, i.e. a leaf.
    kinds: list[tuple[str | None, str]] = []
    closes_later: set[str] = set()
    for tok in reversed(tokens):
        if not tok or _has_bracket(tok):
            kinds.append((None, tok))
        elif tok.startswith("/") and len(tok) > 1:
            kinds.append((CLOSE, tok[1:]))
            closes_later.add(tok[1:])
        elif tok in PHRASE_LABELS or (tok not in POS_TAGS and tok in closes_later):
            kinds.append((OPEN, tok))
        else:
            kinds.append((LEAF, tok))
    yield from reversed(kinds)


def _classify_words(tokens: list[str]) -> Iterator[tuple[str | None, str, int]]:
    """(OPEN | LEAF | CLOSE | None for junk, label, index of the token read) per item of the
    ``words`` form. ``(X`` opens and ``)X`` closes (a word never holds a bracket); a token
    followed by one that is no bracket is a word and its tag, a leaf (so a word may look like a
    tag: ``. .``, ``NN NN``); a lone tag is a leaf without its word; the rest is junk."""
    j = 0
    while j < len(tokens):
        tok = tokens[j]
        nxt = tokens[j + 1] if j + 1 < len(tokens) else None
        if _is_bracket_label(tok):
            yield (OPEN if tok[0] == "(" else CLOSE), tok[1:], j
            j += 1
        elif nxt is not None and not _has_bracket(nxt) and not _has_bracket(tok):
            yield LEAF, nxt, j + 1
            j += 2
        else:
            yield (LEAF, tok, j) if tok in POS_TAGS else (None, tok, j)
            j += 1


def _is_bracket_label(token: str) -> bool:
    """``(X`` or ``)X`` with a label X that holds no bracket."""
    return len(token) > 1 and token[0] in _BRACKETS and not _has_bracket(token[1:])


def _has_bracket(token: str) -> bool:
    return "(" in token or ")" in token


def _join_top(children: list[Tree], fixes: Counter[str]) -> Tree:
    """One root over what the prediction left at the top."""
    phrases = [c for c in children if not c.is_leaf]
    if len(children) == 1 and phrases:
        return children[0]
    if not phrases:
        fixes["flat"] += 1
        return Tree(FALLBACK_LABEL, tuple(children))
    fixes["top_level"] += 1
    if len(phrases) == 1:  # stray leaves beside the one root (often a final period): take them in
        i = children.index(phrases[0])
        root = phrases[0]
        return Tree(root.label, tuple(children[:i]) + root.children + tuple(children[i + 1 :]))
    return Tree(FALLBACK_LABEL, tuple(children))


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")


def pairs(trees: Iterable[Tree], form: str) -> Iterator[tuple[str, str]]:
    """(source, target) text pairs: the words, and the tree in ``form``, space-separated."""
    for tree in trees:
        yield source(tree), " ".join(linearize(tree, form))
