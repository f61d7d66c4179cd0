"""Line-aligned corpus text: readers for the WMT formats and a writer that keeps lines aligned.

Readers take byte streams (archive members) and yield one segment per line: plain text, SGM
(``<seg id="N">text</seg>``, entities unescaped, document order kept) and TSV (one column per
language). ``LineWriter`` writes UTF-8 with ``\\n`` endings and turns any other line-break
character inside a segment into a space, so every reader downstream sees the same line count.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from corpora import CorpusError

__all__ = ["LineWriter", "read_lines", "read_sgm", "read_text_lines", "read_tsv"]

# What str.splitlines() (and so many readers) treats as a line break besides "\n".
_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK_RE = re.compile(f"[{re.escape(_BREAKS)}]")
_BREAK_TABLE = str.maketrans({c: " " for c in _BREAKS})

_SEG = re.compile(r"<seg\b[^>]*>(.*?)</seg>", re.IGNORECASE)
# Only XML's entities and character references: WMT's files carry literal '&' too ("AT&T"),
# which HTML-style unescaping of bare names would mangle.
_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|amp|lt|gt|quot|apos);")
_SPACES = re.compile(r"\s+")


def read_text_lines(stream: Iterable[bytes]) -> Iterator[str]:
    """Lines of a byte stream split on ``\\n`` only, without the ending (``\\r\\n`` too), as UTF-8.

    Invalid UTF-8 becomes U+FFFD rather than stopping a multi-gigabyte corpus.
    """
    for raw in stream:
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        yield raw.decode("utf-8", errors="replace")


def read_sgm(lines: Iterable[str]) -> Iterator[str]:
    """The text of each ``<seg>`` in document order: entities unescaped, spaces collapsed (as
    sacrebleu)."""
    for number, line in enumerate(lines, 1):
        found = False
        for match in _SEG.finditer(line):
            found = True
            text = _ENTITY.sub(lambda m: html.unescape(m.group(0)), match.group(1))
            yield _SPACES.sub(" ", text).strip()
        if not found and line.lstrip().lower().startswith("<seg"):
            raise ValueError(f"line {number}: <seg> without a closing </seg> on the same line")


def read_tsv(lines: Iterable[str], columns: int) -> Iterator[tuple[str, ...]]:
    """Rows of tab-separated text with exactly ``columns`` fields each."""
    for number, line in enumerate(lines, 1):
        row = tuple(line.split("\t"))
        if len(row) != columns:
            raise ValueError(f"line {number}: {len(row)} tab-separated fields, expected {columns}")
        yield row


class LineWriter:
    """Write segments one per line (UTF-8, ``\\n``); counts lines and the fixes it made."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8", newline="\n")
        self.lines = 0
        """Segments written."""
        self.blank_lines = 0
        """Segments that are empty or whitespace only."""
        self.broken_lines = 0
        """Segments that held a line-break character other than ``\\n`` (now a space)."""
        self.replacement_chars = 0
        """Segments holding U+FFFD (often invalid UTF-8 in the source)."""

    def write(self, segment: str) -> None:
        """Append one segment (it must not contain ``\\n``)."""
        if "\n" in segment:
            segment = segment.replace("\n", " ")
            self.broken_lines += 1
        if _BREAK_RE.search(segment):
            segment = segment.translate(_BREAK_TABLE)
            self.broken_lines += 1
        if "\ufffd" in segment:
            self.replacement_chars += 1
        self._file.write(segment)
        self._file.write("\n")
        self.lines += 1
        self.blank_lines += not segment.strip()

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_lines(path: Path) -> list[str]:
    """The segments of a one-segment-per-line UTF-8 file: only ``\\n`` ends a line (a trailing
    ``\\r`` is dropped), so a stray U+2028 inside a segment never shifts the lines after it."""
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            return [line.rstrip("\n").rstrip("\r") for line in f]
    except FileNotFoundError:
        raise CorpusError(f"{path} does not exist") from None
