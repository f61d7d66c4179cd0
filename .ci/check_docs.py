"""The docs check of ``make lint``: what the guides point at exists, and no path of one machine.

- every relative link and image in ``README.md`` and ``docs/**/*.md`` resolves to a file or
  folder of the repository, and a ``#fragment`` to a heading of its target;
- no absolute path of one machine (``/work/...``, ``/root/...``, ``/home/<user>/...``) in
  those documents or in ``configs/*.yaml``;
- every ``make`` target, ``tfm`` subcommand, ``benchmarks/`` script and ``configs/`` file that
  the code of a guide (``README.md``, ``docs/*.md``; not the dated notebooks of ``docs/log/``,
  which keep the commands as they ran) names exists.

Hand-written: link checkers (lychee, markdown-link-check) resolve links but know nothing of our
make targets, tfm subcommands and machine paths; markdown-it-py does the Markdown parsing.

    .venv/bin/python .ci/check_docs.py      # one line per problem, "file:line: what"; exit 1
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.~$-])(?:file://)?/(?:work|root|home/[^/\s]+|Users/[^/\s]+)/")
"""An absolute path of one machine: its work tree, root's or a user's home."""
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
MAKE = re.compile(r"(?<![\w/.-])make\s+(?=(.*))")
TFM = re.compile(r"(?<![\w-])tfm\s+(?=(.*))")
REPO_FILE = re.compile(r"(?<![\w/.-])((?:benchmarks/[\w./-]+\.py)|(?:configs/[\w.-]+\.ya?ml))")
WORD = re.compile(r"^[A-Za-z0-9][\w.-]*$")
COMMENT = re.compile(r"(?:^|\s)#.*$")

Commands = Mapping[str, "Commands"]
"""``tfm``'s subcommands, each with its own (``tfm tracking replay``)."""


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


def anchors(tokens: list[Token]) -> set[str]:
    """Every heading's anchor, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for opening, inline in zip(tokens, tokens[1:], strict=False):
        if opening.type == "heading_open":
            base = slug("".join(c.content for c in inline.children or [] if c.type != "image"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


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


def code(tokens: list[Token]) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every line of fenced and indented code (comments dropped) and of
    every inline code span."""
    for token in tokens:
        if token.type in ("fence", "code_block") and token.map:
            for i, text in enumerate(token.content.splitlines()):
                yield token.map[0] + 1 + (token.type == "fence") + i, COMMENT.sub("", text)
        elif token.type == "inline":
            line = token.map[0] + 1 if token.map else 0
            for child in token.children or []:
                if child.type == "code_inline":
                    yield line, child.content


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


def make_targets(root: Path) -> set[str]:
    rule = re.compile(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)")
    lines = (root / "Makefile").read_text(encoding="utf-8").splitlines()
    return {m.group(1) for m in map(rule.match, lines) if m}


def words(rest: str) -> list[str]:
    """The leading plain words of a command's arguments, up to an option, an assignment or
    anything that is not a plain word."""
    out = []
    for word in rest.split():
        if not WORD.match(word):
            break
        out.append(word)
    return out


def check_command(root: Path, text: str, make: set[str], tfm: Commands) -> Iterator[str]:
    """What one line of a guide's code names that does not exist."""
    for m in MAKE.finditer(text):
        for target in words(m.group(1)):
            if target not in make:
                yield f"`make {target}`: no such target in the Makefile"
    for m in TFM.finditer(text):
        commands, named = tfm, []
        for word in [w for w in m.group(1).split() if not w.startswith("-")]:
            if not commands or not WORD.match(word):
                break
            named.append(word)
            if word not in commands:
                yield f"`tfm {' '.join(named)}`: no such subcommand"
                break
            commands = commands[word]
    for m in REPO_FILE.finditer(text):
        if not (root / m.group(1)).is_file():
            yield f"{m.group(1)}: no such file"


def check(root: Path, tfm: Commands) -> list[Problem]:
    """Every problem in the repository at ``root``; ``tfm``: the command line's subcommands."""
    problems: list[Problem] = []
    make = make_targets(root)
    anchor_cache: dict[Path, set[str]] = {}
    for path in documents(root):
        tokens = parse(path)
        for line, ref in targets(tokens):
            what = check_link(root, path, ref, anchor_cache)
            if what:
                problems.append(Problem(path, line, what))
        if is_guide(root, path):
            for line, text in code(tokens):
                problems += [Problem(path, line, w) for w in check_command(root, text, make, tfm)]
    for path in [*documents(root), *sorted((root / "configs").glob("*.yaml"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        problems += [
            Problem(path, i, f"a path of one machine: {m.group(0)}...")
            for i, text in enumerate(lines, 1)
            for m in MACHINE_PATH.finditer(text)
        ]
    return problems


def subcommands(parser: argparse.ArgumentParser) -> Commands:
    """An argparse parser's subcommands, nested."""
    found: dict[str, Commands] = {}
    for action in parser._actions:  # argparse lists its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = subcommands(sub)
    return found


def tfm_commands() -> Commands:
    from pipelines.cli import build_parser

    return subcommands(build_parser())


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    root = parser.parse_args(list(argv) if argv is not None else None).root.resolve()
    problems = check(root, tfm_commands())
    for problem in problems:
        print(problem.show(root))
    print(f"docs check: {len(documents(root))} documents, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
