"""A config that does not load, as one line: a YAML syntax error with its line and column, a
value JSON cannot hold, or pydantic's first error under the dotted key path it concerns, in
the words of the type hints (``model.n_heads: 7 must be an integer``)."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tasks.framework.config_sections import is_setting
from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError


def yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """One line: the file, the line and column (1-based) and what PyYAML found there."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    opened = getattr(exc, "context_mark", None)
    if context and opened is not None:
        problem += f" ({context} at line {opened.line + 1})"
    return f"{where}: invalid YAML: {problem}"


def not_json(value: Any, key: str = "") -> ConfigError | None:
    """The first value YAML can make but JSON cannot hold (a date, a set, bytes), as an error."""
    if isinstance(value, dict):
        inner = ((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        inner = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, (str, int, float, type(None))):
        return None
    else:
        return ConfigError(
            key,
            f"{value!r} is a YAML {type(value).__name__}, which no setting takes "
            "(quote it to give a string)",
        )
    return next((e for e in (not_json(v, k) for k, v in inner) if e is not None), None)


_EXPECTED = {
    "int": "must be an integer",
    "float": "must be a number",
    "bool": "must be true or false",
    "string": "must be a string",
    "tuple": "must be a list",
}
"""What a value of each kind must be, by the first word of pydantic's error type (``int_type``)."""

_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}
"""A bound a field's constraint (``Ge(1)``) sets: pydantic's error type -> its context key and
sign."""


def config_error(exc: ValidationError, written: dict[str, Any], root: type) -> ConfigError:
    """Pydantic's first error in the order the keys were written, as one ConfigError; the
    errors of a union's branches (``train.num_workers``: an integer or a list) joined by ``;``."""
    found: dict[str, list[str]] = {}
    where: dict[str, tuple[int, ...]] = {}
    for error in exc.errors():
        one = _explain(error, root)
        found.setdefault(one.key, []).append(one.message)
        where.setdefault(one.key, _position(written, error["loc"]))
    key = min(found, key=where.__getitem__)
    return ConfigError(key, "; ".join(found[key]))


def _explain(error: ErrorDetails, root: type) -> ConfigError:
    """One pydantic error as a ConfigError, its key path and message from the type hints."""
    key, hint, outer, in_union = "", root, None, False
    for item in error["loc"]:
        outer = hint = _non_null(hint)
        if dataclasses.is_dataclass(hint):
            key = f"{key}.{item}" if key else str(item)
            hint = _field_types(hint).get(str(item))
        elif typing.get_origin(hint) is tuple:
            args = typing.get_args(hint)
            if not in_union and error["type"] != "missing":
                key += f"[{item}]"
            fixed = isinstance(item, int) and item < len(args)
            hint = args[0] if args[-1] is Ellipsis else args[item] if fixed else None
        elif _is_union(hint):  # item is a branch's tag: each branch's error is the union's
            in_union = True
            hint = next(
                (a for a in typing.get_args(hint) if item in (getattr(a, "__name__", ""), str(a))),
                None,
            )
    if error["type"] == "value_error":
        return _raised(error, key)
    message = _message(error, _non_null(hint), outer)
    if error["type"] in _BOUNDS and _non_null(hint) is not hint:
        message += " or null"  # the field is optional: null is the other way to be right
    return ConfigError(key, message)


def _message(error: ErrorDetails, hint: Any, outer: Any) -> str:
    """What was wrong with the value, in the words of the hand-written checks before pydantic."""
    kind, value = error["type"], error["input"]
    if kind == "unexpected_keyword_argument":
        names = [f.name for f in dataclasses.fields(outer) if is_setting(f)]
        known = ["preset"] * (outer is ModelConfig) + names
        return f"unknown key (known: {', '.join(known)})"
    if kind == "missing" and dataclasses.is_dataclass(outer):
        return "is required"
    if kind in ("missing", "too_long", "too_short"):  # a fixed-length tuple (adam_betas)
        items = typing.get_args(outer if kind == "missing" else hint)
        return f"{value!r} must have {len(items)} items"
    if kind == "literal_error":
        return f"{value!r} is not one of {', '.join(map(repr, typing.get_args(hint)))}"
    if kind == "dataclass_type":
        return f"must be a mapping, got {type(value).__name__}"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        bound = error.get("ctx", {})[key]  # a float field's bound comes as a float: 0 -> 0.0
        return f"{value!r} must be {sign} {int(bound) if float(bound).is_integer() else bound}"
    expected = _EXPECTED.get(kind.split("_")[0])
    return f"{value!r} {expected}" if expected else f"{value!r}: {error['msg']}"


def _raised(error: ErrorDetails, key: str) -> ConfigError:
    """A check written as code that failed (a section's ``__post_init__``, a field's
    validator), under the section's or the field's key."""
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, ConfigError):
        return cause.under(key) if key else cause
    return ConfigError(key, str(cause or error["msg"]))


def _position(data: Any, loc: tuple[int | str, ...]) -> tuple[int, ...]:
    """Where the value at ``loc`` was written: each key's index in its mapping (a key not
    written, a missing ``name``, after every written one)."""
    at: list[int] = []
    for item in loc:
        if not isinstance(data, dict):
            break
        keys = [str(k) for k in data]
        if str(item) not in keys:
            return (*at, sys.maxsize)
        at.append(keys.index(str(item)))
        data = list(data.values())[at[-1]]
    return tuple(at)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _non_null(hint: Any) -> Any:
    """``X`` for ``X | None`` (pydantic checks it as X, allowing null); any other hint as it is."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else []
    return args[0] if len(args) == 1 else hint
