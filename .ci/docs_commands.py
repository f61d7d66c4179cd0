"""The commands of a guide, checked against the real ``tfm`` parser, run config and Makefile.

A line of code is split as a shell line (``shlex``, a ``\\`` continuation already joined); a
command ends at ``|``, ``||``, ``&&``, ``;`` or ``&`` written as a word, redirections (``<<<``,
``>``, ``2>&1``) are dropped with their operand, and whatever stands before ``tfm``, ``make``
or ``prefect`` (``FOO=bar``, ``.venv/bin/``, ``nice -n 19``, ``ray job submit ... --``) is
taken as its environment and launcher. The conventions for ``tfm``:

- A placeholder is ``<...>``, ``...``, ``…`` or a word in capitals (``PORT``, ``WORKDIR``; not
  ``$PWD``, which the shell fills in). A command holding one is checked for its subcommand and
  option names only; a ``--set`` whose value is one is checked for its key only.
- A command in a code block and without placeholders is parsed whole by ``build_parser()``, as
  ``tfm`` would parse it: an argparse error is the problem. Inline code is often a fragment in
  prose (``tfm status --verify``, ``tfm deploy --cron``): its names are checked, and its parse
  may lack a required argument or an option's value.
- The ``configs/*.yaml`` a command names is loaded by ``load_config`` with its ``--set``
  values, which builds the config and runs nothing (no folder made, no Ray, no MLflow). A work
  dir on an object store (``s3://``, ``gs://``), whose client the loader would build, has its
  key checked only, and a config file's own is loaded as the default local one.
- ``RAY_ADDRESS=ray://...`` or ``ray.address=ray://...`` (Ray Client) is refused: the runtime
  joins a cluster as a driver on one of its nodes.

``make``: each target exists and each ``VAR=value`` names a variable the Makefile uses.
``prefect deployment run FLOW/NAME``: the names ``tfm deploy`` gives (``pipeline/<config
name>``, ``stage/<config name>-<stage>``), for a config in ``configs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import shlex
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"<[^<>]+>|\.\.\.|…|(?<![\w$-])[A-Z][A-Z0-9_]+(?![\w-])")
MULTIWORD = re.compile(r"<[^<>\s\"'][^<>]*>")
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
ENDS = {"|", "||", "&&", ";", "&"}
REDIRECT = re.compile(r"^(?:\d?>>?|<<?<?|&>|\d?>&\d)$|^\d?>>?[\w./$]")
"""A redirection: an operator alone (its operand is the next word), or ``>file``, ``2>&1``."""
OPERAND = {"<", "<<", "<<<", ">", ">>", "2>", "2>>", "&>"}
REMOTE = re.compile(r"^(?:s3|gs)://")
RAY_CLIENT = (
    "ray:// (Ray Client): the runtime joins a cluster as a driver on one of its nodes; "
    "run there, or submit a Ray job (docs/cluster.md)"
)
CONFIG = re.compile(r"^(?:--config=)?(configs/[\w.-]+\.ya?ml)$")
PROGRAMS = ("tfm", "make", "prefect")
FRAGMENT = re.compile(r"^the following arguments are required|: expected one argument$")
"""What argparse says of a fragment in prose: an argument or an option's value left out."""


@dataclass(frozen=True)
class Command:
    """One command of a line: what it runs (``tfm``), its arguments and its ``FOO=bar`` words."""

    program: str
    args: list[str]
    env: dict[str, str]

    def show(self) -> str:
        return shlex.join([self.program, *self.args])


def split(text: str) -> Iterator[Command]:
    """The ``tfm``, ``make`` and ``prefect`` commands of a shell line; ValueError if it does
    not split (an unclosed quote)."""
    # "<config or work dir>" is one word, as it is one argument
    words, env = shlex.split(MULTIWORD.sub(lambda m: m.group(0).replace(" ", "_"), text)), {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in ENDS:
            env = {}
        elif REDIRECT.match(word):
            i += word in OPERAND
        elif ASSIGNMENT.match(word):
            env[word.split("=", 1)[0]] = word.split("=", 1)[1]
        elif word.rsplit("/", 1)[-1] in PROGRAMS:
            end = next((j for j in range(i, len(words)) if words[j] in ENDS), len(words))
            yield Command(word.rsplit("/", 1)[-1], _unredirected(words[i:end]), env)
            i, env = end, {}


def _unredirected(args: list[str]) -> list[str]:
    out, skip = [], False
    for word in args:
        if skip:
            skip = False
        elif REDIRECT.match(word):
            skip = word in OPERAND
        else:
            out.append(word)
    return out


# ----------------------------------------------------------------------------- tfm


class _ParseError(Exception):
    pass


def _raise(message: str) -> typing.NoReturn:
    raise _ParseError(message)


def quiet(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and its subparsers raising their error instead of printing it and exiting."""
    parser.error = _raise  # type: ignore[method-assign]
    for action in parser._actions:  # argparse lists its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                quiet(sub)
    return parser


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """argparse's message for ``argv``, or None when it parses (``--help`` included)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            parser.parse_args(argv)
        except _ParseError as exc:
            return str(exc)
        except SystemExit:  # --help, which printed and exits 0
            return None
    return None


def name_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """What argparse would say of ``argv``'s subcommand and option names (values unread)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if PLACEHOLDER.search(word) and not word.startswith("--"):
            if sub is not None:
                return None  # a placeholder subcommand: nothing below it to check
        elif word.startswith("-") and len(word) > 1 and word != "--":
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            if action is None:
                return f"unrecognized arguments: {word}"
            i += action.nargs != 0 and "=" not in word
        elif sub is not None:
            if word not in sub.choices:
                choices = ", ".join(map(repr, sub.choices))
                return f"argument {sub.metavar}: invalid choice: {word!r} (choose from {choices})"
            return name_error(sub.choices[word], argv[i:])
    return None


def check_tfm(parser: argparse.ArgumentParser, command: Command, whole: bool) -> Iterator[str]:
    """What argparse says of a ``tfm`` command; ``whole``: a command, not a prose fragment."""
    args = command.args
    placeholders = any(PLACEHOLDER.search(w) for w in args)
    error = None if whole and not placeholders else name_error(parser, args)
    if error is None and not placeholders:
        error = parse_error(parser, args)
        if not whole and error and FRAGMENT.search(error):
            error = None
    if error:
        yield error
    if command.env.get("RAY_ADDRESS", "").startswith("ray://"):
        yield f"RAY_ADDRESS={command.env['RAY_ADDRESS']}: {RAY_CLIENT}"


# ----------------------------------------------------------------------------- configs


def overrides(args: list[str]) -> list[str]:
    """The ``KEY=VALUE`` of each ``--set``."""
    found = []
    for i, word in enumerate(args):
        if word == "--set" and i + 1 < len(args):
            found.append(args[i + 1])
        elif word.startswith("--set="):
            found.append(word.removeprefix("--set="))
    return found


def known_key(dotted: str) -> bool:
    """Whether ``dotted`` names a field of the run config's schema (or lies under a field that
    is not a section, which the loader checks)."""
    from tasks.framework.config import RunConfig
    from transformer_core.config import ModelConfig

    section: Any = RunConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(section) or (section is ModelConfig and part == "preset"):
            return True
        if part not in {f.name for f in dataclasses.fields(section)}:
            return False
        try:
            section = _section(typing.get_type_hints(section)[part])
        except NameError:  # a hint only a type checker resolves: the loader checks below it
            return True
    return True


def _section(hint: Any) -> Any:
    """The dataclass a field holds (``X | None`` included), or the hint itself."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        classes = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        return classes[0] if len(classes) == 1 else hint
    return hint


def check_config(root: Path, command: Command) -> Iterator[str]:
    """Problems of the config a ``tfm`` command names, loaded with its ``--set`` values."""
    from tasks.framework.config import ConfigError, load_config

    path = next((m.group(1) for m in map(CONFIG.match, command.args) if m), None)
    if path is None or not (root / path).is_file():
        return
    values: dict[str, str] = {}
    for item in overrides(command.args):
        key, sep, value = item.partition("=")
        if not sep:
            yield f"--set {item}: an override must look like key.path=value"
        elif value.startswith("ray://") and key == "ray.address":
            yield f"--set {item}: {RAY_CLIENT}"
        elif PLACEHOLDER.search(value) or REMOTE.match(value):
            if not known_key(key):
                yield f"{key}: unknown key (--set {item})"
        else:
            values[key] = value
    written = yaml.safe_load((root / path).read_text(encoding="utf-8"))
    if isinstance(written, dict) and REMOTE.match(str(written.get("workdir", ""))):
        values.setdefault("workdir", "runs/{name}")  # else the loader builds the store's client
    try:
        values = {k: yaml.safe_load(v) for k, v in values.items()}
        load_config(root / path, values)
    except yaml.YAMLError as exc:
        yield f"a --set value is no YAML: {exc}"
    except ConfigError as exc:
        yield str(exc)


# ----------------------------------------------------------------------------- make, prefect


def check_make(makefile: str, targets: set[str], command: Command) -> Iterator[str]:
    """Each target exists; each ``VAR=value`` names a variable of the Makefile."""
    for word in command.args:
        assignment = ASSIGNMENT.match(word)
        if assignment and not re.search(rf"\b{assignment.group(1)}\b", makefile):
            yield f"`make {assignment.group(1)}=...`: the Makefile uses no {assignment.group(1)}"
        elif not assignment and not word.startswith("-") and not PLACEHOLDER.search(word):
            if word not in targets:
                yield f"`make {word}`: no such target in the Makefile"


def deployments(root: Path) -> set[str]:
    """The ``FLOW/NAME`` prefixes ``tfm deploy`` can give: each config's name, as pipeline and
    (with ``-<stage>`` after it) as stage."""
    found = set()
    for path in sorted((root / "configs").glob("*.yaml")):
        written = yaml.safe_load(path.read_text(encoding="utf-8"))
        name = written.get("name", path.stem) if isinstance(written, dict) else path.stem
        found |= {f"pipeline/{name}", f"stage/{name}-"}
    return found


def check_prefect(names: set[str], command: Command) -> Iterator[str]:
    """A ``prefect deployment run FLOW/NAME`` names a deployment ``tfm deploy`` makes."""
    if command.args[:2] != ["deployment", "run"] or len(command.args) < 3:
        return
    name = command.args[2]
    if PLACEHOLDER.search(name):
        return
    if name not in names and not any(n.endswith("-") and name.startswith(n) for n in names):
        yield f"tfm deploy makes no deployment {name} (pipeline/<config name>)"


# ----------------------------------------------------------------------------- a line


@dataclass(frozen=True)
class Known:
    """What the commands of the guides are checked against."""

    root: Path
    parser: argparse.ArgumentParser
    makefile: str
    targets: set[str]
    deployments: set[str]


def known(root: Path, parser: argparse.ArgumentParser) -> Known:
    """The repository at ``root``'s Makefile and deployments, and ``tfm``'s parser."""
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    rule = re.compile(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", re.M)
    return Known(root, quiet(parser), makefile, set(rule.findall(makefile)), deployments(root))


def check_line(k: Known, text: str, whole: bool) -> Iterator[str]:
    """The problems of the commands in one line of code; ``whole``: of a code block."""
    if not re.search(r"(?<![\w.-])(?:tfm|make|prefect)(?![\w-])", text):
        return
    try:
        commands = list(split(text))
    except ValueError as exc:
        yield f"`{text.strip()}`: not a shell line ({exc})"
        return
    for command in commands:
        if command.program == "make":
            yield from check_make(k.makefile, k.targets, command)
            continue
        found = (
            [*check_tfm(k.parser, command, whole), *check_config(k.root, command)]
            if command.program == "tfm"
            else check_prefect(k.deployments, command)
        )
        yield from (f"`{command.show()}`: {what}" for what in found)
