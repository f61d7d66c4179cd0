"""Run configs: YAML files loaded into frozen, typed dataclasses.

Every section is a keyword-only dataclass with a one-line doc per field; the libraries own the
sections they read (``ModelConfig`` in transformer_core, ``DecodeConfig`` in serving), the
stage-only ones are in ``tasks.config_sections``. Loading
checks types, rejects unknown keys, and runs each section's own validation; any failure is one
``ConfigError`` whose message starts with the dotted key path (``model.n_heads: ...``).

Hand-written rather than pydantic: the whole validator is the ~100 lines of ``_build`` and
``_coerce`` over the dataclasses' own type hints, and the sections stay plain frozen dataclasses
that transformer_core (torch, numpy and the standard library only) can define too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from corpora.encoding import ShardConfig
from corpora.filters import CleanConfig
from corpora.sources import split_pair
from corpora.subwords import TokenizerConfig
from serving.translator import DecodeConfig
from tasks.config_sections import (
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


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the pipeline: every stage's settings, the model, and where things go."""

    name: str
    """Run name; names the work directory and MLflow runs."""
    seed: int = 1234
    """Seed for sampling, shuffling and initialisation."""
    workdir: str = "runs/{name}"
    """Artifact root; ``{name}`` is replaced by the run name. Relative paths are from the CWD."""
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

    @property
    def root(self) -> Path:
        """The run's artifact root folder."""
        return Path(self.workdir.format(name=self.name))

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
        return f"sqlite:///{(self.root / 'mlflow.db').resolve()}"

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
    except ConfigError as exc:
        overrides = overrides or {}
        given = next((k for k in overrides if exc.key == k or exc.key.startswith(f"{k}.")), None)
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
    data = dict(data)
    model = data.pop("model", None)
    config = _build(RunConfig, data, "")
    if model is not None:
        config = dataclasses.replace(config, model=_build_model(model))
    return config


def to_dict(obj: Any) -> Any:
    """Plain, JSON-ready data for a config or section (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
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


def _build_model(data: Any) -> ModelConfig:
    if not isinstance(data, dict):
        raise ConfigError("model", f"must be a mapping, got {type(data).__name__}")
    data = dict(data)
    preset_name = data.pop("preset", "base")
    try:
        preset = presets.get(str(preset_name))
    except ConfigError as exc:
        raise exc.under("model") from None
    names = {f.name: f for f in dataclasses.fields(ModelConfig)}
    hints = typing.get_type_hints(ModelConfig)
    changes = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"model.{key}", f"unknown key (known: preset, {', '.join(names)})")
        changes[key] = _coerce(value, hints[key], f"model.{key}")
    try:
        return preset.replace(**changes)
    except ConfigError as exc:
        raise exc.under("model") from None


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(where, f"unknown key (known: {', '.join(fields)})")
        kwargs[key] = _coerce(value, hints[key], where)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{path}.{missing[0]}" if path else missing[0]
        raise ConfigError(where, "is required")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise exc.under(path) if path else exc from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a type hint, converting lists to tuples and ints to floats."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(exc.message)
        raise ConfigError(where, "; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ConfigError(where, f"{value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where, f"{value!r} must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(where, f"{value!r} must have {len(args)} items")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"{value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"{value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, f"{value!r} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"{value!r} must be a string")
        return value
    return value


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, "cannot override inside a non-mapping")
    node[keys[-1]] = value
