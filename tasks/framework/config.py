"""Run configs: YAML files loaded into frozen, typed dataclasses, once per command.

Every section is a keyword-only dataclass with a one-line doc per field; the libraries own the
sections they read (``ModelConfig`` in transformer_core, ``DecodeConfig`` in serving), the
stage-only ones are in ``tasks.framework.config_sections``. Pydantic checks a file against the
dataclasses' own type hints and their constraints (``Annotated[int, Ge(1)]``, ``Literal``),
strictly and as JSON (``"3"`` is no integer, ``yes`` no boolean, a list is a tuple), refuses
unknown keys, and runs the ``__post_init__`` rules between fields; any failure is one
``ConfigError`` whose message starts with the dotted key path (``model.n_heads: ...``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from corpora.encoding import ShardConfig
from corpora.filters import CleanConfig
from corpora.sources import split_pair
from corpora.subwords import TokenizerConfig
from serving.translator import DecodeConfig
from tasks.framework.config_sections import (
    AverageConfig,
    DataConfig,
    MlflowConfig,
    ParsingConfig,
    RayConfig,
    RegisterConfig,
)
from training.config import TrainConfig
from transformer_core import presets
from transformer_core.config import ConfigError, ModelConfig

__all__ = [
    "ConfigError", "RunConfig", "load_config", "config_from_dict", "to_dict", "flatten", "fingerprint",
    "DataConfig", "CleanConfig", "TokenizerConfig", "ShardConfig", "TrainConfig", "AverageConfig",
    "DecodeConfig", "RegisterConfig", "MlflowConfig", "RayConfig", "ParsingConfig",
]

TRACKING_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI") or None
"""``MLFLOW_TRACKING_URI`` as this process found it, the team server for configs that name none.
Read once: ``mlflow.set_tracking_uri`` rewrites the variable, so a later read would see the
store of the last run this process logged to."""


Workdir = Path
"""The type of a run's artifact root, from load to the stages (one place to make it URI-aware)."""


def workdir_of(template: str, name: str) -> Workdir:
    """``workdir`` as written (``{name}`` for the run name) as the absolute folder it names."""
    return Path(template.format(name=name)).resolve()


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the pipeline: every stage's settings, the model, and where things go."""

    # Pydantic's settings, for RunConfig and every section in it: unknown keys are an error, and
    # values are taken as YAML wrote them (no "3" for 3, no "yes" for true).
    __pydantic_config__ = {"extra": "forbid", "strict": True}

    name: str
    """Run name; names the work directory and MLflow runs."""
    seed: int = 1234
    """Seed for sampling, shuffling and initialisation."""
    workdir: Workdir = Path("runs/{name}")
    """Artifact root; ``{name}`` is replaced by the run name. Relative paths are from the CWD at
    load, where it is resolved once: every stage sees the same absolute folder."""
    model: ModelConfig = field(default_factory=presets.base)
    """Architecture: ``preset: <name>`` plus any ModelConfig fields to override."""
    data: DataConfig = field(default_factory=DataConfig)
    """Download stage."""
    clean: CleanConfig = field(default_factory=CleanConfig)
    """Clean stage."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer stage."""
    shard: ShardConfig = field(default_factory=ShardConfig)
    """Shard stage."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Train stage."""
    average: AverageConfig = field(default_factory=AverageConfig)
    """Average stage."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """Translate stage."""
    register: RegisterConfig = field(default_factory=RegisterConfig)
    """Register stage."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Tracking."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray runtime."""
    parsing: ParsingConfig = field(default_factory=ParsingConfig)
    """Constituency parsing (the parsing pipeline only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", workdir_of(str(self.workdir), self.name))

    @property
    def root(self) -> Workdir:
        """The run's artifact root folder (``workdir``, resolved at load)."""
        return self.workdir

    @property
    def languages(self) -> tuple[str, str]:
        """Source and target file suffixes, from ``data.pair`` (``words``/``tree`` for parsing)."""
        return split_pair(self.data.pair)

    @property
    def tracking_uri(self) -> str:
        """MLflow tracking URI: the config's, else ``MLFLOW_TRACKING_URI`` (a team server set
        for every run on a machine), else SQLite in the work dir."""
        if self.mlflow.tracking_uri:
            return self.mlflow.tracking_uri
        if TRACKING_URI_AT_START:
            return TRACKING_URI_AT_START
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def decoding(self) -> DecodeConfig:
        """How this run decodes: the decode section, with the parsing section's beam, alpha,
        output offset (the paper: 21, 0.3, input + 300) and tree constraint for the parsing
        pipeline."""
        if self.data.source != "treebank":
            return self.decode
        p = self.parsing
        return dataclasses.replace(
            self.decode,
            beam_size=p.beam_size,
            alpha=p.alpha,
            max_len_offset=p.max_len_offset,
            tree_constraint=p.form if p.constrained else None,
        )

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some sections or fields replaced."""
        return dataclasses.replace(self, **changes)



# ----------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config; errors name the file and the key path."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("", f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError("", yaml_error(path, exc)) from None
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: top level must be a mapping, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        return config_from_dict(data)
    except ConfigError as exc:  # hand-written: only the loader knows which values --set gave
        overrides = overrides or {}
        given = next((k for k in overrides if exc.key == k or exc.key.startswith((f"{k}.", f"{k}["))), None)
        where = f"from --set {given}={overrides[given]!r}" if given else f"in {path}"
        raise ConfigError(exc.key, f"{exc.message} ({where})") from None


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


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from plain data (as YAML gives it)."""
    written, data = data, dict(data)
    if data.get("model") is None:
        data.pop("model", None)
    elif isinstance(data["model"], dict):
        data["model"] = _with_preset(data["model"])
    try:
        blob = json.dumps(data)
    except TypeError as exc:
        raise (_not_json(data) or ConfigError("", str(exc))) from None
    try:
        return _adapter().validate_json(blob)
    except ValidationError as exc:
        raise _config_error(exc, written) from None


def to_dict(obj: Any) -> Any:
    """Plain, JSON-ready data for a config or section (tuples become lists)."""
    # Hand-written, not pydantic's dump: every stage fingerprint hashes exactly this form.
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A config or nested dict as dotted keys: ``{"train": {"steps": 1}}`` -> ``{"train.steps": 1}``."""
    data = to_dict(data)
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def fingerprint(data: Any) -> str:
    """A stable sha256 of JSON-ready data (sorted keys)."""
    blob = json.dumps(to_dict(data), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@functools.cache
def _adapter() -> TypeAdapter[RunConfig]:
    return TypeAdapter(RunConfig)  # built at the first load, not at import


def _with_preset(model: dict[str, Any]) -> dict[str, Any]:
    """The model section as ``preset: <name>`` (base if none) with the keys it sets replaced."""
    # Hand-written: a preset is a function (presets.py), a default no type hint can name.
    model = dict(model)
    try:
        preset = presets.get(str(model.pop("preset", "base")))
    except ConfigError as exc:
        raise exc.under("model") from None
    return {**dataclasses.asdict(preset), **model}


def _not_json(value: Any, key: str = "") -> ConfigError | None:
    """The first value YAML can make but JSON cannot hold (a date, a set, bytes), as an error."""
    if isinstance(value, dict):
        inner = ((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        inner = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, (str, int, float, type(None))):
        return None
    else:
        return ConfigError(key, f"{value!r} is a YAML {type(value).__name__}, which no setting takes "
                                "(quote it to give a string)")
    return next((e for e in (_not_json(v, k) for k, v in inner) if e is not None), None)


_EXPECTED = {"int": "must be an integer", "float": "must be a number", "bool": "must be true or false",
             "string": "must be a string", "tuple": "must be a list"}
"""What a value of each kind must be, by the first word of pydantic's error type (``int_type``)."""

_BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
           "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}
"""A bound a field's constraint (``Ge(1)``) sets: pydantic's error type -> its context key and sign."""


def _config_error(exc: ValidationError, written: dict[str, Any]) -> ConfigError:
    """Pydantic's first error in the order the keys were written, as one ConfigError; the
    errors of a union's branches (``train.num_workers``: an integer or a list) joined by ``;``."""
    found: dict[str, list[str]] = {}
    where: dict[str, tuple[int, ...]] = {}
    for error in exc.errors():
        one = _explain(error)
        found.setdefault(one.key, []).append(one.message)
        where.setdefault(one.key, _position(written, error["loc"]))
    key = min(found, key=where.__getitem__)
    return ConfigError(key, "; ".join(found[key]))


def _explain(error: ErrorDetails) -> ConfigError:
    """One pydantic error as a ConfigError, its key path and message from the type hints."""
    key, hint, outer, in_union = "", RunConfig, None, False
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
            hint = next((a for a in typing.get_args(hint) if item in (getattr(a, "__name__", ""), str(a))), None)
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
        known = ["preset"] * (outer is ModelConfig) + [f.name for f in dataclasses.fields(outer)]
        return f"unknown key (known: {', '.join(known)})"
    if kind == "missing" and dataclasses.is_dataclass(outer):
        return "is required"
    if kind in ("missing", "too_long", "too_short"):  # a fixed-length tuple (adam_betas)
        return f"{value!r} must have {len(typing.get_args(outer if kind == 'missing' else hint))} items"
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


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, "cannot override inside a non-mapping")
    node[keys[-1]] = value
