"""``ConfigError``, the error a bad setting raises with its dotted key, and ``check_choices``,
the one check of a config's ``Literal`` fields (a module of its own, so that the corpus libraries
that raise it do not count the model's config as their code)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


OMITTED_AT_DEFAULT = types.MappingProxyType({"omitted_at_default": True})
"""A field's metadata for a setting added after configs were fingerprinted: left out of the
config's plain form (what stage fingerprints and MLflow params hold) while at its default, so
a config that does not set it keeps its fingerprints."""


class ConfigError(ValueError):
    """A bad configuration value; ``key`` is the dotted path of the offending field."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` prepended to its key path."""
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.message)


def check_choices(settings: DataclassInstance) -> None:
    """ConfigError naming the first field of the dataclass ``settings`` whose value is not one
    of its ``Literal`` type's (``X | None`` allows None too)."""
    hints = _type_hints(type(settings))
    for f in dataclasses.fields(settings):
        choices = _literal_values(hints[f.name])
        value = getattr(settings, f.name)
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices if c is not None)
            if None in choices:
                allowed += " or null"
            raise ConfigError(f.name, f"{value!r} is not one of {allowed}")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _literal_values(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` (or ``Literal | None``) hint allows; None for other hints."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if get_origin(hint) in (Union, types.UnionType):
        parts = [_literal_values(a) if a is not type(None) else (None,) for a in get_args(hint)]
        if all(p is not None for p in parts):
            return tuple(v for p in parts if p is not None for v in p)
    return None
