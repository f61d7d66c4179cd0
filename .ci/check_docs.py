"""The docs check of ``make lint``: what the guides point at exists, and no path of one machine.

- every relative link and image in ``README.md`` and ``docs/**/*.md`` resolves to a file or
  folder of the repository, and a ``#fragment`` to a heading of its target;
- no absolute path of one machine (``/work/...``, ``/root/...``, ``/home/<user>/...``) in
  those documents or in ``configs/*.yaml``;
- every ``benchmarks/`` script and ``configs/`` file that the code of a guide (``README.md``,
  ``docs/*.md``; not the dated notebooks of ``docs/log/``, which keep the commands as they ran)
  names exists, and its ``tfm``, ``make`` and ``prefect deployment run`` commands are right:
  parsed by ``tfm``'s own parser, the config loaded with their ``--set`` values (see
  ``docs_commands.py`` for the conventions);
- every prose reference to a section of a guide (``see running.md, "Reruns"``, ``x.md's
  section "Y"``, ``section "Y" of x.md``) names the start of a heading of that file.

Hand-written: link checkers (lychee, markdown-link-check) resolve links but know nothing of our
make targets, tfm subcommands and machine paths; markdown-it-py does the Markdown parsing.

    .venv/bin/python .ci/check_docs.py      # one line per problem, "file:line: what"; exit 1
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, run as a script or not
import docs_commands  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.~$-])(?:file://)?/(?:work|root|home/[^/\s]+|Users/[^/\s]+)/")
"""An absolute path of one machine: its work tree, root's or a user's home."""
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
REPO_FILE = re.compile(r"(?<![\w/.-])((?:benchmarks/[\w./-]+\.py)|(?:configs/[\w.-]+\.ya?ml))")
COMMENT = re.compile(r"(?:^|\s)#.*$")
ROW_ANCHOR = re.compile(r'<a id="([\w.-]+)"></a>')
"""A table row's anchor, as benchmarks/figures.py writes one into the results table."""
SHELL = ("", "bash", "sh", "shell", "console", "text")
"""The fences whose lines are shell lines (not ``yaml`` or ``python``)."""
_FILE = r"(?:\[[^\]]*\]\((?P<link>[^)\s#]+\.md)\)|`?(?P<path>[\w./-]+\.md)`?)"
_TITLE = r"[\"“](?P<title>[^\"”]+)[\"”]"
SECTION_REFS = (
    re.compile(_FILE + r"(?:'s)?,?\s+(?:section\s+)?" + _TITLE),
    re.compile(r"section\s+" + _TITLE + r"\s+(?:of|in)\s+" + _FILE),
)
"""A prose reference to a section: ``x.md, "Title"``, ``x.md's section "Title"``, ``section
"Title" of x.md``, the file a path or a link."""


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    what: str

    def show(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}: {self.what}"


def documents(root: Path) -> list[Path]:
    """The README and every Markdown file under ``docs/``."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def is_guide(root: Path, path: Path) -> bool:
    """The README and ``docs/*.md``; the notebooks of ``docs/log/`` are history."""
    return path.parent in (root, root / "docs")


def parse(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(tokens: list[Token]) -> list[str]:
    """Every heading's text, as GitHub shows it (code spans without their backticks)."""
    return [
        "".join(c.content for c in inline.children or [] if c.type != "image")
        for opening, inline in zip(tokens, tokens[1:], strict=False)
        if opening.type == "heading_open"
    ]


def anchors(tokens: list[Token]) -> set[str]:
    """Every heading's anchor, repeats numbered as GitHub numbers them, and every
    ``<a id="...">`` (a row of a generated table)."""
    seen: dict[str, int] = {}
    found = set()
    for base in map(slug, headings(tokens)):
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    inline = (t.content for t in tokens if t.type == "inline")
    return found | {m.group(1) for text in inline for m in ROW_ANCHOR.finditer(text)}


def targets(tokens: list[Token]) -> Iterator[tuple[int, str]]:
    """``(line, href or src)`` of every link and image."""
    for token in tokens:
        if token.type != "inline":
            continue
        line = token.map[0] + 1 if token.map else 0
        for child in token.children or []:
            ref = child.attrGet("href") if child.type == "link_open" else child.attrGet("src")
            if child.type in ("link_open", "image") and isinstance(ref, str):
                yield line, ref


def code(tokens: list[Token]) -> Iterator[tuple[int, str, str]]:
    """``(line, text, kind)`` of every line of fenced and indented code (comments dropped; a
    ``\\`` continuation, or a shell line's open quote, joined to the next) and of every inline
    code span; ``kind``: "shell", "inline", or "other" for a fence of YAML, Python and the like."""
    for token in tokens:
        if token.type in ("fence", "code_block") and token.map:
            shell = token.type == "code_block" or token.info.strip() in SHELL
            kind = "shell" if shell else "other"
            first, joined = None, ""
            for i, text in enumerate(token.content.splitlines()):
                first = i if first is None else first
                text = COMMENT.sub("", text).rstrip()
                if text.endswith("\\"):
                    joined += text[:-1] + " "
                    continue
                if shell and open_quote(joined + text):
                    joined += text + "\n"
                    continue
                yield token.map[0] + 1 + (token.type == "fence") + first, joined + text, kind
                first, joined = None, ""
            if first is not None:  # a quote or a continuation the block never closes
                yield token.map[0] + 1 + (token.type == "fence") + first, joined, kind
        elif token.type == "inline":
            line = token.map[0] + 1 if token.map else 0
            for child in token.children or []:
                if child.type == "code_inline":
                    yield line, child.content, "inline"


def open_quote(text: str) -> bool:
    """Whether a shell line leaves a quote open (a string that goes on on the next line)."""
    try:
        shlex.split(text)
    except ValueError:
        return True
    return False


def section_refs(root: Path, path: Path, tokens: list[Token]) -> Iterator[tuple[int, Path, str]]:
    """``(line, file, title)`` of every prose reference to a section of a Markdown file."""
    for token in tokens:
        if token.type != "inline" or not token.map:
            continue
        for pattern in SECTION_REFS:
            for m in pattern.finditer(token.content):
                name = m.group("link") or m.group("path")
                place = (path.parent / name).resolve()
                if not place.exists() and not m.group("link"):
                    place = (root / name).resolve()  # a path written from the repository's root
                line = token.map[0] + 1 + token.content.count("\n", 0, m.start("title"))
                yield line, place, " ".join(m.group("title").split())


def check_section(root: Path, place: Path, title: str, cache: dict[Path, list[str]]) -> str | None:
    """What is wrong with a reference to the section ``title`` of ``place``, or None."""
    shown = place.relative_to(root) if place.is_relative_to(root) else place
    if not place.is_file():
        return f'{shown}, "{title}": no such file'
    if place not in cache:
        cache[place] = [" ".join(h.lower().split()) for h in headings(parse(place))]
    if not any(h.startswith(title.lower()) for h in cache[place]):
        return f'{shown}, "{title}": no such section (no heading starts so)'
    return None


def check_link(root: Path, path: Path, ref: str, anchor_cache: dict[Path, set[str]]) -> str | None:
    """What is wrong with the relative link ``ref`` in ``path``, or None."""
    if SCHEME.match(ref):
        return None
    target, _, fragment = ref.partition("#")
    place = (path.parent / target).resolve() if target else path
    if not place.is_relative_to(root):
        return f"{ref}: points outside the repository"
    if not place.exists():
        return f"{ref}: no such file"
    if fragment and place.suffix == ".md":
        if place not in anchor_cache:
            anchor_cache[place] = anchors(parse(place))
        if fragment not in anchor_cache[place]:
            return f"{ref}: no heading #{fragment} in {place.relative_to(root)}"
    return None


def check_guide(
    root: Path, path: Path, tokens: list[Token], known: docs_commands.Known
) -> Iterator[Problem]:
    """The problems only a guide is held to: its commands, files and section references."""
    cache: dict[Path, list[str]] = {}
    for line, place, title in section_refs(root, path, tokens):
        what = check_section(root, place, title, cache)
        if what:
            yield Problem(path, line, what)
    for line, text, kind in code(tokens):
        for m in REPO_FILE.finditer(text):
            if not (root / m.group(1)).is_file():
                yield Problem(path, line, f"{m.group(1)}: no such file")
        if kind != "other":
            for what in docs_commands.check_line(known, text, whole=kind == "shell"):
                yield Problem(path, line, what)


def check(root: Path, parser: argparse.ArgumentParser) -> list[Problem]:
    """Every problem in the repository at ``root``; ``parser``: ``tfm``'s command line."""
    problems: list[Problem] = []
    known = docs_commands.known(root, parser)
    anchor_cache: dict[Path, set[str]] = {}
    for path in documents(root):
        tokens = parse(path)
        for line, ref in targets(tokens):
            what = check_link(root, path, ref, anchor_cache)
            if what:
                problems.append(Problem(path, line, what))
        if is_guide(root, path):
            problems += check_guide(root, path, tokens, known)
    for path in [*documents(root), *sorted((root / "configs").glob("*.yaml"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        problems += [
            Problem(path, i, f"a path of one machine: {m.group(0)}...")
            for i, text in enumerate(lines, 1)
            for m in MACHINE_PATH.finditer(text)
        ]
    return problems


def tfm_parser() -> argparse.ArgumentParser:
    from pipelines.cli import build_parser

    return build_parser()


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    root = parser.parse_args(list(argv) if argv is not None else None).root.resolve()
    problems = check(root, tfm_parser())
    for problem in problems:
        print(problem.show(root))
    print(f"docs check: {len(documents(root))} documents, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
