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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from corpora.encoding import ShardConfig
from corpora.filters import CleanConfig
from corpora.sources import split_pair
from corpora.storage import StorageError, Store, StoreSettings, is_remote, open_store
from corpora.subwords import TokenizerConfig
from parsing.nltk_sample import find_sample
from serving.translator import DecodeConfig
from tasks.framework.config_errors import config_error, not_json, yaml_error
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
from transformer_core.search_settings import beam_fields

__all__ = [
    "ConfigError",
    "RunConfig",
    "load_config",
    "config_from_dict",
    "to_dict",
    "flatten",
    "fingerprint",
    "DataConfig",
    "CleanConfig",
    "TokenizerConfig",
    "ShardConfig",
    "TrainConfig",
    "AverageConfig",
    "DecodeConfig",
    "RegisterConfig",
    "MlflowConfig",
    "RayConfig",
    "ParsingConfig",
]

TRACKING_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI") or None
"""``MLFLOW_TRACKING_URI`` as this process found it, the team server for configs that name none.
Read once: ``mlflow.set_tracking_uri`` rewrites the variable, so a later read would see the
store of the last run this process logged to."""


Workdir = str
"""The type of a run's artifact root, from load to the stages: an absolute local path, or an
object store's URI (``s3://bucket/prefix``, ``gs://bucket/prefix``)."""


def workdir_of(template: str | Path, name: str) -> Workdir:
    """``workdir`` as written (``{name}`` for the run name): the absolute folder it names, or
    the store URI it names (without a trailing '/'); a ConfigError for another scheme."""
    text = str(template).format(name=name)
    if is_remote(text):
        return text.rstrip("/")
    if "://" in text:
        raise ConfigError(
            "workdir", f"{text!r}: use a local path, s3://bucket/prefix or gs://bucket/prefix"
        )
    return str(Path(text).resolve())


def node_folder_suffix(workdir: Workdir) -> str:
    """What ends the name of this node's folder for a work dir on an object store (its URI's
    digest): how a run's local files are found from the URI alone."""
    return hashlib.sha256(workdir.encode()).hexdigest()[:8]


@functools.lru_cache(maxsize=8)
def _store(workdir: str, settings: StoreSettings) -> Store:
    return open_store(workdir, settings)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the pipeline: every stage's settings, the model, and where things go."""

    # Pydantic's settings, for RunConfig and every section in it: unknown keys are an error, and
    # values are taken as YAML wrote them (no "3" for 3, no "yes" for true).
    __pydantic_config__ = {"extra": "forbid", "strict": True}

    name: str
    """Run name; names the work directory and MLflow runs. Left out, the loader takes the config
    file's name without ``.yaml``."""
    seed: int = 1234
    """Seed for sampling, shuffling and initialisation."""
    workdir: Workdir = "runs/{name}"
    """Artifact root; ``{name}`` is replaced by the run name. A local path (relative paths are
    from the CWD at load, where it is resolved once: every stage sees the same absolute folder),
    or a prefix on an object store: ``s3://bucket/prefix``, ``gs://bucket/prefix``."""
    storage: StoreSettings = field(default_factory=StoreSettings)
    """How to reach the object store a ``workdir`` URI names (the secrets stay in environment
    variables), and this node's cache folder for it."""
    model: ModelConfig = field(default_factory=presets.base)
    """The model's architecture: ``preset: <name>`` (default base) plus any of its keys to
    override."""
    data: DataConfig = field(default_factory=DataConfig)
    """The corpus: its source, language pair and dev and test sets (the download stage)."""
    clean: CleanConfig = field(default_factory=CleanConfig)
    """The clean stage's filters of the training pairs."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The subword model the tokenizer stage trains, and the text's preparation before it."""
    shard: ShardConfig = field(default_factory=ShardConfig)
    """How the shard stage encodes the corpus into Parquet shards."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The train stage: the training recipe and its Ray Train scaling."""
    average: AverageConfig = field(default_factory=AverageConfig)
    """The average stage: which checkpoints make the final model."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """How the translate stage (and the registered model) decodes: the search and its engine."""
    register: RegisterConfig = field(default_factory=RegisterConfig)
    """The register stage: the registered model's name and the metric that picks the champion."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Experiment tracking: the MLflow server, the experiment, and how calls to it retry."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Where Ray runs: a cluster's address, or a local Ray that a stage starts."""
    parsing: ParsingConfig = field(default_factory=ParsingConfig)
    """Constituency parsing (the parsing pipeline only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", workdir_of(self.workdir, self.name))
        if self.data.source == "treebank" and self.parsing.treebank_dir is None:
            # Resolved once at load, so every stage and fingerprint sees the same folder; when
            # NLTK's sample is absent the treebank stage says how to get it.
            sample = find_sample()
            if sample is not None:
                parsing = dataclasses.replace(self.parsing, treebank_dir=str(sample))
                object.__setattr__(self, "parsing", parsing)
        if is_remote(self.workdir):
            try:
                _store(self.workdir, self.storage)  # the URI and the credential variables, now
            except StorageError as exc:
                raise ConfigError("workdir", str(exc)) from None
            if not (self.mlflow.tracking_uri or TRACKING_URI_AT_START):
                raise ConfigError(
                    "mlflow.tracking_uri",
                    f"the work dir {self.workdir} is on an object store, where MLflow's SQLite "
                    "database cannot live: set it to a tracking server (or sqlite:////<local "
                    "path>/mlflow.db), or set MLFLOW_TRACKING_URI",
                )

    @property
    def root(self) -> Path:
        """The run's local folder: the work dir itself (resolved at load), or with a work dir on
        an object store, this node's folder for the run's local files (its log, caches,
        staging) under ``storage.cache_dir``."""
        if not is_remote(self.workdir):
            return Path(self.workdir)
        return (
            self.storage.cache_root() / "runs" / f"{self.name}-{node_folder_suffix(self.workdir)}"
        )

    @property
    def store(self) -> Store:
        """The work dir as a ``Store``: a local folder, or a prefix of an object store (its
        client, built once per process; ``Store.check`` asks the server)."""
        return _store(self.workdir, self.storage)

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
        """How this run decodes: the decode section, with the parsing section's search settings
        (the paper: beam 21, alpha 0.3, input + 300) and tree constraint for the parsing
        pipeline."""
        if self.data.source != "treebank":
            return self.decode
        p = self.parsing
        return dataclasses.replace(
            self.decode, **beam_fields(p), tree_constraint=p.form if p.constrained else None
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
        given = next(
            (k for k in overrides if exc.key == k or exc.key.startswith((f"{k}.", f"{k}["))), None
        )
        where = f"from --set {given}={overrides[given]!r}" if given else f"in {path}"
        raise ConfigError(exc.key, f"{exc.message} ({where})") from None


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
        raise (not_json(data) or ConfigError("", str(exc))) from None
    try:
        return _adapter().validate_json(blob)
    except ValidationError as exc:
        raise config_error(exc, written, RunConfig) from None


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
    """A config or nested dict as dotted keys:
    ``{"train": {"steps": 1}}`` -> ``{"train.steps": 1}``."""
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


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, "cannot override inside a non-mapping")
    node[keys[-1]] = value
