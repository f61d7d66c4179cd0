"""Penn Treebank trees: an immutable tree type, a streaming reader, and cleaning.

The reader takes PTB ``.mrg`` files (multi-line trees, each wrapped in an empty root bracket
``( (S ...) )``) and one-tree-per-line files alike: it follows brackets, not lines. Cleaning
removes what the parsers of the literature never see: ``-NONE-`` elements and the constituents
they leave empty, function tags (``NP-SBJ`` -> ``NP``) and indices (``NP-SBJ-1``, ``NP=2``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Tree",
    "TreebankError",
    "walk",
    "write_tree",
    "parse_tree",
    "iter_trees",
    "read_trees",
    "strip_label",
    "clean_tree",
]

ROOT_LABELS = frozenset({"", "TOP", "ROOT"})
"""Labels of a root bracket that is not a constituent: PTB's empty one, and TOP/ROOT elsewhere."""
NONE_TAG = "-NONE-"

OPEN, LEAF, CLOSE = "open", "leaf", "close"

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_BAD_TEXT = re.compile(r"[\s()]")
_FUNCTION_TAG = re.compile(r"[-=|]")


class TreebankError(ValueError):
    """A malformed treebank file: the message starts with ``file:line``."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source
        self.line = line


# ----------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class Tree:
    """A constituent (``label`` over ``children``) or a leaf (``label`` = POS tag over ``word``)."""

    label: str
    """Phrase label (NP, VP, ...) or, for a leaf, the POS tag."""
    children: tuple[Tree, ...] = ()
    """Sub-trees, left to right; empty for a leaf."""
    word: str | None = None
    """The word of a leaf; None for a constituent."""

    def __post_init__(self) -> None:
        if _BAD_TEXT.search(self.label):
            raise ValueError(f"label {self.label!r} holds whitespace or a bracket")
        if self.word is not None:
            if self.children:
                raise ValueError(f"leaf ({self.label} {self.word}) cannot have children")
            if not self.word or _BAD_TEXT.search(self.word):
                raise ValueError(f"word {self.word!r} is empty or holds whitespace or a bracket")

    @property
    def is_leaf(self) -> bool:
        """True for a (POS word) leaf."""
        return self.word is not None

    def leaves(self) -> list[Tree]:
        """The leaves, left to right."""
        return [node for kind, node in walk(self) if kind == LEAF]

    def words(self) -> list[str]:
        """The words, left to right."""
        return [leaf.word for leaf in self.leaves() if leaf.word is not None]  # every leaf's

    def tags(self) -> list[str]:
        """The POS tags, left to right."""
        return [leaf.label for leaf in self.leaves()]

    def __str__(self) -> str:
        return write_tree(self)


def walk(tree: Tree) -> Iterator[tuple[str, Tree]]:
    """``(OPEN, node)``, ``(LEAF, leaf)``, ``(CLOSE, node)`` events in order, without recursion."""
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, closing = stack.pop()
        if closing:
            yield CLOSE, node
        elif node.word is not None:
            yield LEAF, node
        else:
            yield OPEN, node
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))


def write_tree(tree: Tree) -> str:
    """The tree as one bracketed line: ``(S (NP (NNP John)) (VP (VBZ runs)))``."""
    parts: list[str] = []
    for kind, node in walk(tree):
        if kind == OPEN:
            parts.append(f" ({node.label}")
        elif kind == LEAF:
            parts.append(f" ({node.label} {node.word})")
        else:
            parts.append(")")
    return "".join(parts).lstrip()


# ----------------------------------------------------------------------------- reading


class _Frame:
    """A bracket being read."""

    __slots__ = ("label", "children", "word", "line")

    def __init__(self, line: int) -> None:
        self.label: str | None = None
        self.children: list[Tree] = []
        self.word: str | None = None
        self.line = line


def iter_trees(
    lines: Iterable[str], source: str = "<string>", *, keep_root: bool = False
) -> Iterator[Tree]:
    """Trees from bracketed text, streamed; a malformed tree raises ``TreebankError`` (source:line).
    A root bracket (empty, TOP or ROOT) is dropped unless ``keep_root`` (EVALB counts an empty
    or ROOT one as a bracket: ``evaluation.evalb.score_files``)."""
    stack: list[_Frame] = []
    line_no = 0
    for line_no, line in enumerate(lines, start=1):
        for match in _TOKEN.finditer(line):
            token = match.group()
            if token == "(":
                _open_bracket(stack, source, line_no)
            elif token == ")":
                if not stack:
                    raise TreebankError(
                        source, line_no, "unbalanced brackets: ')' without a matching '('"
                    )
                tree = _finish(stack.pop(), source, line_no)
                if stack:
                    stack[-1].children.append(tree)
                else:
                    yield tree if keep_root else _unwrap(tree)
            else:
                _add_text(stack, token, source, line_no)
    if stack:
        raise TreebankError(
            source,
            line_no,
            f"unbalanced brackets: the tree opened at line {stack[0].line} is not closed "
            f"at the end ({len(stack)} bracket(s) open)",
        )


def _open_bracket(stack: list[_Frame], source: str, line_no: int) -> None:
    if stack:
        top = stack[-1]
        if top.label is None:
            if len(stack) > 1:
                raise TreebankError(source, line_no, "a bracket without a label")
            top.label = ""  # PTB's empty root bracket: ( (S ...) )
        if top.word is not None:
            raise TreebankError(
                source, line_no, f"({top.label} {top.word} ...) mixes a word and brackets"
            )
    stack.append(_Frame(line_no))


def _add_text(stack: list[_Frame], token: str, source: str, line_no: int) -> None:
    """A label (the first text in a bracket) or the one word of a preterminal."""
    if not stack:
        raise TreebankError(source, line_no, f"stray text {token!r} outside a tree")
    top = stack[-1]
    if top.label is None:
        top.label = token
    elif top.children:
        raise TreebankError(
            source, line_no, f"word {token!r} among the brackets of ({top.label} ...)"
        )
    elif top.word is not None:
        raise TreebankError(
            source, line_no, f"({top.label} {top.word} {token} ...): more than one word"
        )
    else:
        top.word = token


def _finish(frame: _Frame, source: str, line: int) -> Tree:
    if frame.label is None:
        raise TreebankError(source, line, "empty brackets ()")
    if frame.word is not None:
        if not frame.label:
            raise TreebankError(source, line, f"( {frame.word}) has no POS tag")
        return Tree(frame.label, word=frame.word)
    if not frame.children:
        raise TreebankError(source, line, f"({frame.label}) has neither a word nor children")
    return Tree(frame.label, tuple(frame.children))


def _unwrap(tree: Tree) -> Tree:
    """Drop a root bracket around one constituent; a root over several becomes TOP."""
    if tree.is_leaf or tree.label not in ROOT_LABELS:
        return tree
    if len(tree.children) == 1 and not tree.children[0].is_leaf:
        return tree.children[0]
    return Tree("TOP", tree.children)


def parse_tree(text: str, *, keep_root: bool = False) -> Tree:
    """Exactly one tree from a string (for example one line of a ``.trees`` file)."""
    trees = list(iter_trees(text.splitlines(), keep_root=keep_root))
    if len(trees) != 1:
        raise TreebankError("<string>", 1, f"expected one tree, found {len(trees)}")
    return trees[0]


def read_trees(path: str | Path, *, clean: bool = False, keep_root: bool = False) -> Iterator[Tree]:
    """Trees of a ``.mrg`` or one-tree-per-line file, streamed; ``clean`` applies ``clean_tree``
    and skips trees that clean away entirely; ``keep_root`` as ``iter_trees``."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for tree in iter_trees(f, source=str(path), keep_root=keep_root):
            if clean:
                cleaned = clean_tree(tree)
                if cleaned is not None:
                    yield cleaned
            else:
                yield tree


# ----------------------------------------------------------------------------- cleaning


def strip_label(label: str) -> str:
    """``NP-SBJ-1`` -> ``NP``, ``PP-LOC-CLR`` -> ``PP``, ``NP=2`` -> ``NP``, and the annotators'
    alternatives ``ADVP|PRT`` -> ``ADVP``; ``-NONE-``, ``-LRB-`` and ``-RRB-`` (labels that start
    with a dash) stay as they are."""
    if label.startswith("-"):
        return label
    return _FUNCTION_TAG.split(label, maxsplit=1)[0] or label


def clean_tree(tree: Tree) -> Tree | None:
    """Without -NONE- leaves, the constituents left empty, function tags and indices; None if
    nothing is left."""
    stack: list[list[Tree]] = [[]]
    for kind, node in walk(tree):
        if kind == OPEN:
            stack.append([])
        elif kind == LEAF:
            if node.label != NONE_TAG:
                stack[-1].append(Tree(strip_label(node.label), word=node.word))
        else:
            children = stack.pop()
            if children:
                stack[-1].append(Tree(strip_label(node.label), tuple(children)))
    top = stack[0]
    return _unwrap(top[0]) if top else None
