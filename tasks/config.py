"""Run configs: YAML files loaded into frozen, typed dataclasses.

Every section is a keyword-only dataclass with a one-line doc per field; the libraries own the
sections they read (``ModelConfig`` in transformer_core, ``DecodeConfig`` in serving). Loading
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

from corpora import CorpusError
from corpora.encoding import ShardConfig
from corpora.filters import CleanConfig
from corpora.sources import (
    STANDARD_EVAL,
    multi30k_eval_set,
    multi30k_train,
    split_pair,
    train_corpora,
)
from corpora.subwords import TokenizerConfig
from corpora.synthetic import PAIRS as SYNTHETIC_PAIRS
from serving.translator import DecodeConfig
from training.config import TrainConfig
from transformer_core import presets
from transformer_core.config import ConfigError, ModelConfig

__all__ = ["ConfigError", "RunConfig", "load_config", "config_from_dict", "to_dict", "flatten"]

TRACKING_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI") or None
"""``MLFLOW_TRACKING_URI`` as this process found it, the team server for configs that name none.
Read once: ``mlflow.set_tracking_uri`` rewrites the variable, so a later read would see the
store of the last run this process logged to."""


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the parallel corpus comes from (download stage)."""

    source: Literal["synthetic", "wmt14", "multi30k", "local", "treebank"] = "synthetic"
    """synthetic: the offline grammar corpus; wmt14: statmt.org or a mirror; multi30k: Multi30k task 1; local: files on disk; treebank: PTB files."""
    pair: str = "en-de"
    """Language pair as src-tgt, e.g. en-de or en-fr (multi30k: two of en, de, fr, cs)."""
    corpora: tuple[str, ...] = ()
    """Training corpora names from the source registry; empty means the registry's default set (multi30k: leave empty)."""
    dev: str | None = None
    """Development set name; null means the source's standard: newstest2013 (wmt14), val (multi30k)."""
    test: str | None = None
    """Test set name; null means the source's standard: newstest2014 (wmt14; release: test_variant), test_2016_flickr (multi30k)."""
    test_variant: Literal["full", "filtered"] = "full"
    """newstest2014 release: full (3,003 segments) or filtered (2,737); Multi30k test sets have one (full)."""
    mirror: str | None = None
    """A file:// folder or http(s):// base replacing statmt.org (multi30k: the repository root); offline clusters, tests."""
    local_dir: str | None = None
    """For source=local: a folder with train/dev/test .<lang> files (or treebank files)."""
    max_retries: int = 5
    """Download attempts per file before giving up (exponential backoff between them)."""
    cache_dir: str | None = None
    """Where downloaded archives are kept between runs; null means <workdir>/cache/downloads."""
    lock_file: str | None = None
    """JSON file pinning each download's sha256 and size when first seen; null means <workdir>/downloads.lock.json."""
    local_train: tuple[str, ...] = ("train",)
    """For source=local: training file prefixes in local_dir (each <prefix>.<lang>; the prefix names the corpus)."""
    local_dev: str = "dev"
    """For source=local: dev file prefix in local_dir (<prefix>.<lang>)."""
    local_test: str = "test"
    """For source=local: test file prefix in local_dir (<prefix>.<lang>)."""
    synthetic_train: int = 20000
    """For source=synthetic: number of training pairs."""
    synthetic_dev: int = 500
    """For source=synthetic: number of dev pairs."""
    synthetic_test: int = 500
    """For source=synthetic: number of test pairs."""

    def __post_init__(self) -> None:
        try:
            split_pair(self.pair)
        except ValueError as exc:
            raise ConfigError("pair", str(exc)) from None
        if self.source == "treebank" and self.pair != "words-tree":
            raise ConfigError("pair", f"{self.pair!r}: the parsing pipeline's pair is words-tree (words in, trees out)")
        if self.max_retries < 1:
            raise ConfigError("max_retries", f"{self.max_retries} must be >= 1")
        # Sources without named sets (local, synthetic, treebank) keep WMT14's names, as before.
        # Resolved here, not in each reader, so every stage and fingerprint sees the same names.
        dev, test = STANDARD_EVAL.get(self.source, STANDARD_EVAL["wmt14"])
        if self.dev is None:
            object.__setattr__(self, "dev", dev)
        if self.test is None:
            object.__setattr__(self, "test", test)
        if self.source == "multi30k":
            self._check_multi30k()
        elif self.source == "synthetic" and self.pair not in SYNTHETIC_PAIRS:
            raise ConfigError("pair", f"{self.pair!r}: the synthetic corpus is English-German "
                                      f"({' or '.join(SYNTHETIC_PAIRS)})")
        elif self.source == "wmt14":
            try:
                train_corpora(self.pair, self.corpora)
            except CorpusError as exc:
                raise ConfigError("corpora" if "unknown corpus" in str(exc) else "pair", str(exc)) from None

    def _check_multi30k(self) -> None:
        """The pair's languages and the dev and test sets must be Multi30k's."""
        if self.corpora:
            raise ConfigError(
                "corpora", f"{list(self.corpora)}: Multi30k has one training corpus; leave data.corpora empty"
            )
        if self.test_variant != "full":
            raise ConfigError(
                "test_variant", f"{self.test_variant!r} is a newstest2014 release; Multi30k test sets have one (full)"
            )
        try:
            multi30k_train(self.pair)
        except CorpusError as exc:
            raise ConfigError("pair", str(exc)) from None
        for key in ("dev", "test"):
            try:
                multi30k_eval_set(getattr(self, key), self.pair)
            except CorpusError as exc:
                raise ConfigError(key, str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class AverageConfig:
    """Checkpoint averaging (paper section 6.1)."""

    last: int = 5
    """Number of checkpoints averaged (base 5, big 20)."""
    spacing: Literal["step", "time"] = "step"
    """Pick the last N by step, or the last N spaced by checkpoint_minutes (the paper's way)."""
    select: Literal["last", "best"] = "last"
    """last: average the last N checkpoints (the paper); best: take the best checkpoint by dev
    BLEU alone (needs train.bleu_sentences; with train.patience the last ones are past it)."""

    def __post_init__(self) -> None:
        if self.last < 1:
            raise ConfigError("last", f"{self.last} must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RegisterConfig:
    """The MLflow model registry."""

    model_name: str = "transformer-translator"
    """Registered model name."""
    metric: str = "bleu_sacre"
    """Metric that decides whether a new version takes the champion alias."""


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    """Experiment tracking."""

    tracking_uri: str | None = None
    """Tracking server; null means MLFLOW_TRACKING_URI if set, else sqlite:///<workdir>/mlflow.db."""
    experiment: str = "transformer"
    """Experiment name."""


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Where Ray runs."""

    address: str | None = None
    """Cluster address; null means RAY_ADDRESS or a local Ray started by the stage."""
    num_cpus: int | None = None
    """CPUs for a local Ray (null: all)."""
    dashboard: bool = True
    """Start the dashboard with a local Ray (on 127.0.0.1): Ray Train's cleanup uses its State API."""
    loopback: bool = True
    """A local Ray binds every port it opens to 127.0.0.1; false: to the machine's address."""


@dataclass(frozen=True, kw_only=True)
class ParsingConfig:
    """English constituency parsing (paper section 6.3): treebank, splits, target form, decoding."""

    treebank_dir: str | None = None
    """Treebank root, e.g. a licensed LDC99T42 copy's parsed/mrg/wsj (holding 00/ ... 24/)."""
    train_files: tuple[str, ...] = ("0[2-9]/*.mrg", "1[0-9]/*.mrg", "2[01]/*.mrg")
    """Glob patterns under treebank_dir for training trees (default: WSJ sections 02-21)."""
    dev_files: tuple[str, ...] = ("22/*.mrg",)
    """Glob patterns for development trees (default: WSJ section 22); empty for none."""
    test_files: tuple[str, ...] = ("23/*.mrg",)
    """Glob patterns for test trees (default: WSJ section 23)."""
    form: Literal["t2t", "vinyals", "words"] = "t2t"
    """Target form: t2t (tags kept, closing brackets labelled, as the paper), vinyals (tags as XX) or words (each word written before its tag)."""
    beam_size: int = 21
    """Beam width for parsing (the paper: 21)."""
    alpha: float = 0.3
    """Length penalty exponent for parsing (the paper: 0.3)."""
    max_len_offset: int = 300
    """Maximum output length = input length + this (the paper: 300)."""
    constrained: bool = False
    """Beam search keeps every hypothesis a well-formed tree with one POS slot per word (needs tokenizer.target_symbols)."""
    evalb_max_error: int | None = 10
    """EVALB's MAX_ERROR: parse_score fails, as EVALB gives up, at error sentence number this + 2; null scores them all."""
    silver_corpus: str | None = None
    """Semi-supervised setting: a file of extra (silver) trees added to the training split."""

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ConfigError("beam_size", f"{self.beam_size} must be >= 1")
        if self.alpha < 0:
            raise ConfigError("alpha", f"{self.alpha} must be >= 0")
        if self.max_len_offset < 0:
            raise ConfigError("max_len_offset", f"{self.max_len_offset} must be >= 0")
        if self.evalb_max_error is not None and self.evalb_max_error < 0:
            raise ConfigError("evalb_max_error", f"{self.evalb_max_error} must be >= 0 or null")
        for name in ("train_files", "dev_files", "test_files"):
            for pattern in getattr(self, name):
                if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                    raise ConfigError(name, f"{pattern!r} must be a glob relative to treebank_dir")


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
