"""The config reference of ``make lint``: ``docs/config.md``, written from the config classes.

Every key of a run config (``RunConfig`` and, recursively, every section in it) with its dotted
key, its type as pydantic checks it (``Literal`` values, ``annotated_types`` bounds such as
``Ge(1)``, a validator's docstring), its default and its meaning: the docstring under the field,
the one source of the text. The model section's presets come from ``transformer_core.presets``.
A field without a docstring is an error, as is a committed file that differs from what this
writes. A value a command derives and carries with the config (``NOT_A_SETTING``) is no key and
is not listed.

Hand-written: pydantic reads attribute docstrings (``use_attribute_docstrings``) from the body
of the validated class only, so the fields a section inherits (``BeamSettings``' under
``decode`` and ``parsing``) would have none; ``ast`` over each class of the MRO finds them all.

    .venv/bin/python .ci/config_reference.py           # check: one line and exit 1 if stale
    .venv/bin/python .ci/config_reference.py --write   # write docs/config.md
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt

from tasks.framework.config import RunConfig
from tasks.framework.config_sections import is_setting
from transformer_core import presets
from transformer_core.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path("docs/config.md")
WRITE = ".venv/bin/python .ci/config_reference.py --write"
"""The command that rewrites the reference, as the check names it."""
BOUNDS = {Ge: (">=", "ge"), Gt: (">", "gt"), Le: ("<=", "le"), Lt: ("<", "lt")}
"""``annotated_types`` bounds: how each reads, and its attribute."""
CODE = re.compile(r"(``.+?``|`[^`]+`)")

INTRO = f"""\
# Config reference

<!-- Written by .ci/config_reference.py from the config classes; do not edit by hand. -->

Every key of a run config: its type with the values it allows, its default and what it does.
This page is written from the config classes themselves (`RunConfig` in
[tasks/framework/config.py](../tasks/framework/config.py) and the sections it holds): each key's
text is the docstring under its field. `make lint` fails when the page and the code differ;
`{WRITE}` writes it again.

A run config is one YAML file of these keys, one mapping per section (`train:`, `data:`, ...);
a key left out takes its default. Any key can also be given on the command line of every
command that reads a config (`run`, `stage`, `status`, `serve`, `translate`, `export`, `import`,
`deploy`, whose deployments apply it on each run, `ui` and `tracking replay`), as
`--set train.steps=200` (the value read as YAML). Unknown keys are an error, and values are
taken as written: `"3"` is a string, not an integer. Types read as YAML: `null` is YAML's null,
`list of str` a YAML list, `[int, int]` a list of exactly two; `int >= 1` is a bound checked at
load. Rules between keys, and the ranges that are not part of a type here, are checked at load
too: the error names the key.
"""


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Section:
    key: str
    cls: type
    rows: list[Row]


class Undocumented(Exception):
    """Fields (or section classes) without a docstring: one ``file:line: what`` line each."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


# ----------------------------------------------------------------------------- docstrings


@functools.cache
def _class_node(cls: type) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node


def _string(node: ast.stmt | None) -> str | None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return node.value.value if isinstance(node.value.value, str) else None
    return None


def own_docs(cls: type) -> dict[str, str | None]:
    """The docstring under each field that ``cls``'s own body annotates (None where none)."""
    body = _class_node(cls).body
    return {
        stmt.target.id: _string(after)
        for stmt, after in zip(body, [*body[1:], None], strict=True)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    }


def field_docs(cls: type) -> dict[str, str | None]:
    """Each field's docstring, from the class that declares it last in the MRO."""
    docs: dict[str, str | None] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(own_docs(klass))
    return docs


def class_doc(cls: type) -> str | None:
    """The docstring written in the class (a dataclass without one gets its signature)."""
    return ast.get_docstring(_class_node(cls))


def one_line(text: str) -> str:
    """A docstring as one line: paragraphs and wrapped lines joined."""
    return " ".join(inspect.cleandoc(text).split())


def _relative(file: str | None) -> str:
    path = Path(file or "?")
    return (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix()


def _where(cls: type, name: str | None = None) -> str:
    lines, start = inspect.getsourcelines(cls)
    line = start
    if name is not None:
        line = next((start + i for i, t in enumerate(lines) if t.strip().startswith(f"{name}:")))
    return f"{_relative(inspect.getsourcefile(cls))}:{line}"


def undocumented(cls: type) -> list[str]:
    """``file:line: what`` for ``cls`` and each section under it where a docstring is missing."""
    found = [] if class_doc(cls) else [f"{_where(cls)}: class {cls.__name__} has no docstring"]
    docs = field_docs(cls)
    for f in filter(is_setting, dataclasses.fields(cls)):
        owner = next(k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {}))
        if not (docs.get(f.name) or "").strip():
            found.append(f"{_where(owner, f.name)}: {owner.__name__}.{f.name} has no docstring")
        hint = _hints(cls)[f.name]
        sub = section_of(hint) or item_section(hint)
        if sub is not None:
            found += undocumented(sub)
            continue
        try:
            type_text(hint)
        except Undocumented as exc:
            found += exc.lines
    return list(dict.fromkeys(found))


# ----------------------------------------------------------------------------- types and values


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def type_text(hint: Any) -> tuple[str, list[str]]:
    """A type hint as it reads in YAML (``int >= 1``, ``"full" | "filtered"``, ``str | null``,
    ``list of str``), and the docstrings of the validators in it."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is type(None):
        return "null", []
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args), []
    if origin in (Union, types.UnionType):
        parts = [type_text(a) for a in args]
        return " | ".join(t for t, _ in parts), [n for _, notes in parts for n in notes]
    if origin is Annotated:
        return _annotated(args[0], args[1:])
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            text, notes = type_text(args[0])
            return f"list of {text}", notes
        parts = [type_text(a) for a in args]
        return f"[{', '.join(t for t, _ in parts)}]", [n for _, notes in parts for n in notes]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " | ".join(json.dumps(m.value) for m in hint), []
    if hint in (str, int, float, bool):
        return hint.__name__, []
    raise TypeError(f"the config reference cannot render the type {hint!r}")


def _annotated(base: Any, metadata: Iterable[Any]) -> tuple[str, list[str]]:
    text, notes = type_text(base)
    for item in metadata:
        bound = BOUNDS.get(type(item))
        validator = getattr(item, "func", None)
        if bound is not None:
            text += f" {bound[0]} {getattr(item, bound[1])}"
        elif validator is not None:
            if not validator.__doc__:
                file = _relative(inspect.getsourcefile(validator))
                where = f"{file}:{validator.__code__.co_firstlineno}"
                raise Undocumented([f"{where}: validator {validator.__name__} has no docstring"])
            note = one_line(validator.__doc__)
            notes.append(note[:1].lower() + note[1:])
        else:
            raise TypeError(f"the config reference cannot render {item!r} (on {base!r})")
    return text, notes


def default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's default value, or ``dataclasses.MISSING``."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def value_text(value: Any) -> str:
    """A default as YAML (JSON) writes it: ``null``, ``true``, ``"runs/{name}"``, ``[0.9, 0.98]``;
    a dash for none."""
    if value is dataclasses.MISSING:
        return "—"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def cell(text: str) -> str:
    """Markdown for one table cell: pipes escaped, and outside code spans the ``<`` of
    placeholders such as ``<workdir>``, which would read as HTML."""
    parts = CODE.split(text)
    return "".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts)).replace(
        "|", "\\|"
    )


# ----------------------------------------------------------------------------- sections


def anchor(key: str) -> str:
    """GitHub's anchor of a section's heading, ``## `a.b` ``."""
    return re.sub(r"[^\w\- ]", "", key.lower()).replace(" ", "-")


def section_of(hint: Any) -> type | None:
    """The section class a field holds: a dataclass, or one that may be null (``X | None``);
    None for a plain value."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    args = get_args(hint)
    if get_origin(hint) in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        other = next(a for a in args if a is not type(None))
        return other if isinstance(other, type) and dataclasses.is_dataclass(other) else None
    return None


def item_section(hint: Any) -> type | None:
    """The section class each item of a list field is (``tuple[X, ...]`` of a dataclass X);
    None for any other field."""
    args = get_args(hint)
    if get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
    return None


def row(cls: type, f: dataclasses.Field[Any], prefix: str, doc: str) -> Row:
    key = f"{prefix}{f.name}"
    hint = _hints(cls)[f.name]
    if item_section(hint) is not None:
        link = f"list of section [`{key}[]`](#{anchor(key + '[]')})"
        return Row(key, link, value_text(list(default_of(f))), one_line(doc))
    if section_of(hint) is not None:
        link = f"section [`{key}`](#{anchor(key)})"
        if section_of(hint) is hint:
            return Row(key, link, "", one_line(doc))
        return Row(key, f"{link} or `null`", value_text(default_of(f)), one_line(doc))
    text, notes = type_text(hint)
    kind = f"`{text}`" + "".join(f": {note}" for note in notes)
    return Row(key, kind, value_text(default_of(f)), one_line(doc))


def sections(cls: type, key: str = "") -> Iterator[Section]:
    """``cls``'s own keys as one section, then each section under it, depth first."""
    docs, rows, nested = field_docs(cls), [], []
    prefix = f"{key}." if key else ""
    for f in filter(is_setting, dataclasses.fields(cls)):
        rows.append(row(cls, f, prefix, docs.get(f.name) or ""))
        hint = _hints(cls)[f.name]
        if section_of(hint) is not None:
            nested.append((f"{prefix}{f.name}", section_of(hint)))
        elif item_section(hint) is not None:
            nested.append((f"{prefix}{f.name}[]", item_section(hint)))
    yield Section(key, cls, rows)
    for sub_key, sub in nested:
        yield from sections(sub, sub_key)


def preset_row() -> Row:
    """``model.preset``: not a field, but the loader's (``config._with_preset``)."""
    field = next(f for f in dataclasses.fields(RunConfig) if f.name == "model")
    factory = field.default_factory
    default = getattr(factory, "__name__", "")
    names = " | ".join([*(json.dumps(n) for n in presets.PRESETS), '"table3:<row>"'])
    return Row(
        "model.preset",
        f"`{names}`",
        value_text(default) if default in presets.PRESETS else "—",
        "The preset the section starts from: its values are the defaults of the other "
        "`model.*` keys, which override them one by one ([presets](#presets)).",
    )


def preset_table() -> list[str]:
    """Each preset (and Table 3 row) with its docstring and the values it changes."""
    plain = ModelConfig()
    same = [f"`{n}`" for n in presets.PRESETS if presets.get(n) == plain]
    lines = [
        "### Presets",
        "",
        "`preset: <name>` in the `model:` section starts it from one of these (the defaults in "
        f"the table above are {' and '.join(same) or 'no preset'}'s); `table3:<row>` is the "
        "base model with the changes of one row of the paper's Table 3.",
        "",
        "| preset | what it is | changes from the defaults above |",
        "|---|---|---|",
    ]
    rows = {n: presets.PRESETS[n].__doc__ or "" for n in presets.PRESETS}
    rows.update({f"table3:{r}": f"Table 3, row {r}." for r in presets.TABLE3_ROWS})
    for name, doc in rows.items():
        model = presets.get(name)
        changes = [
            f"`{f.name}: {json.dumps(getattr(model, f.name))}`"
            for f in dataclasses.fields(model)
            if getattr(model, f.name) != getattr(plain, f.name)
        ]
        lines.append(f"| `{name}` | {cell(one_line(doc))} | {', '.join(changes) or '-'} |")
    return lines


def section_lines(section: Section) -> list[str]:
    cls = section.cls
    path = _relative(inspect.getsourcefile(cls))
    title = f"`{section.key}`" if section.key else "Top level"
    lines = [
        f"## {title}",
        "",
        cell(one_line(class_doc(cls) or "")),
        f"`{cls.__name__}` in [{path}](../{path}).",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    rows = [preset_row(), *section.rows] if section.key == "model" else section.rows
    lines += [f"| `{r.key}` | {cell(r.type)} | {r.default} | {cell(r.meaning)} |" for r in rows]
    if section.key == "model":
        lines += ["", *preset_table()]
    return lines


def render(root: type = RunConfig) -> str:
    """The reference of config class ``root``; ``Undocumented`` if a docstring is missing."""
    missing = undocumented(root)
    if missing:
        raise Undocumented(missing)
    lines = INTRO.splitlines()
    for section in sections(root):
        lines += ["", *section_lines(section)]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TARGET}")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        text = render(RunConfig)  # looked up now: the tests plant another root
    except Undocumented as exc:
        print("\n".join(exc.lines))
        return 1
    path = args.root / TARGET
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {TARGET}")
        return 0
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        print(f"{TARGET} is out of date: run {WRITE}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
