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
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import TypeAdapter, ValidationError

from corpora.encoding import ShardConfig
from corpora.filters import CleanConfig
from corpora.sources import split_pair
from corpora.subwords import TokenizerConfig
from filesystem.storage import StorageError, Store, StoreSettings
from serving.serve_config import ServeConfig
from serving.translator import DecodeConfig
from tasks.framework.config_errors import config_error, not_json, yaml_error
from tasks.framework.config_eval import EvalConfig, check_test_sets
from tasks.framework.config_parent import check_init_from
from tasks.framework.config_sections import (
    NOT_A_SETTING,
    AverageConfig,
    DataConfig,
    DistillConfig,
    ExportConfig,
    FairseqConfig,
    MlflowConfig,
    ParsingConfig,
    RayConfig,
    RegisterConfig,
    TeacherPin,
    is_setting,
)
from tasks.framework.workdir_place import holds_files, run_root, store_at, workdir_of
from training.config import TrainConfig, refuse_replaced
from transformer_core import presets
from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError
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
    "FairseqConfig",
    "DistillConfig",
    "ExportConfig",
    "ServeConfig",
    "EvalConfig",
]

Workdir = str
"""The type of a run's artifact root, from load to the stages: an absolute local path, or an
object store's URI (``s3://bucket/prefix``, ``gs://bucket/prefix``)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the pipeline: every stage's settings, the model, and where things go."""

    # Pydantic's settings, for RunConfig and every section in it: unknown keys are an error, and
    # values are taken as YAML wrote them (no "3" for 3, no "yes" for true).
    __pydantic_config__ = {"extra": "forbid", "strict": True}

    name: str
    """Run name; names the work directory and MLflow runs. Left out, the loader takes the config
    file's name without ``.yaml``."""
    pipeline: PipelineName | None = None
    """The pipeline the config runs: ``wmt14`` (any translation source), ``distill`` (needs
    ``distill.teacher``), ``fairseq`` (needs ``fairseq.checkpoint``, which ``tfm import
    fairseq`` gives) or ``parsing`` (needs ``data.source: treebank``); null: the one those keys
    name, else wmt14. A config that sets another pipeline's key is refused."""
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
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The test sets the model is judged on: the primary one (data.test) and any others, which
    the evaluate stage translates and scores."""
    register: RegisterConfig = field(default_factory=RegisterConfig)
    """The register stage: the registered model's name and the metric that picks the champion."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Knowledge distillation: the registered teacher (set, the config runs the distill
    pipeline), how it translates the corpus, and the share of its translations dropped."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """The export stage (the distill pipeline): the CTranslate2 folder's weight type."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """``tfm serve``: a registered version on Ray Serve (address, token, replicas, engine,
    batching), and the limits of one request, which register stores with each version."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Experiment tracking: the MLflow server, the experiment, and how calls to it retry."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Where Ray runs: a cluster's address, or a local Ray that a stage starts."""
    parsing: ParsingConfig = field(default_factory=ParsingConfig)
    """Constituency parsing (the parsing pipeline only)."""
    fairseq: FairseqConfig = field(default_factory=FairseqConfig)
    """A fairseq checkpoint to import and register (the fairseq pipeline only)."""
    team_tracking_uri: str | None = field(
        default=None, compare=False, repr=False, metadata=NOT_A_SETTING
    )
    """``MLFLOW_TRACKING_URI`` as the process found it at its start, given to the loader: the
    tracking server of a config that names none. Not a setting (never hashed nor logged)."""
    parent: TeacherPin | None = field(
        default=None, compare=False, repr=False, metadata=NOT_A_SETTING
    )
    """The model ``train.init_from`` named when the parent stage was about to run (its
    ``resolve``), or as the stage's folder records it (``tfm status``); None: not resolved.
    Not a setting (never hashed nor logged)."""

    def __post_init__(self) -> None:
        # Rules only: building a config derives nothing and asks nothing outside (the loader
        # derives, the stage or command that needs the world asks it).
        named = [(key, name) for key, name in _PIPELINE_KEYS if _sets(self, key)]
        if self.pipeline is None and len(named) > 1:
            (key1, name1), (key2, name2) = named[:2]
            raise ConfigError(
                key2,
                f"names the {name2} pipeline and {key1} the {name1} pipeline; a config runs "
                "one: leave one of them out",
            )
        for key, name in named:
            if self.pipeline not in (None, name):
                raise ConfigError(
                    key,
                    f"names the {name} pipeline, but pipeline is {self.pipeline}: leave it out "
                    f"or set pipeline: {name}",
                )
        needed = next((key for key, name in _PIPELINE_KEYS if name == self.pipeline), None)
        if needed is not None and not _sets(self, needed):
            raise ConfigError("pipeline", f"{self.pipeline} needs {needed}")
        check_test_sets(self.eval.test_sets, self.data)
        check_init_from(self.train, self.tokenizer, self.pipeline_name)

    @property
    def pipeline_name(self) -> PipelineName:
        """The pipeline this config runs: ``pipeline``, else the one its keys name (a
        fairseq checkpoint, treebank data, a teacher), else wmt14."""
        named = (name for key, name in _PIPELINE_KEYS if _sets(self, key))
        return self.pipeline or next(named, "wmt14")

    @property
    def root(self) -> Path:
        """The run's local folder: the work dir itself (resolved at load), or with a work dir on
        an object store, this node's folder for the run's local files (its log, caches,
        staging) under ``storage.cache_dir``."""
        return run_root(self.workdir, self.name, self.storage)

    @property
    def store(self) -> Store:
        """The work dir as a ``Store``: a local folder, or a prefix of an object store (its
        client, built at the first ask and kept for the process; ``Store.check`` asks the
        server); a ConfigError on ``workdir`` for a URI or credentials that cannot work."""
        try:
            return store_at(self.workdir, self.storage)
        except StorageError as exc:
            raise ConfigError("workdir", str(exc)) from None

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
        if self.team_tracking_uri:
            return self.team_tracking_uri
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
        """A copy with some sections or fields replaced, its values derived as the loader's."""
        return _derived(dataclasses.replace(self, **changes))


PipelineName = Literal["wmt14", "distill", "fairseq", "parsing"]
"""The pipelines (``tasks.framework.graph.PIPELINES``)."""

_PIPELINE_KEYS: tuple[tuple[str, PipelineName], ...] = (
    ("fairseq.checkpoint", "fairseq"),
    ("data.source: treebank", "parsing"),
    ("distill.teacher", "distill"),
)
"""The key that names each pipeline but wmt14 (the one a config that names none runs)."""


def _sets(config: RunConfig, key: str) -> bool:
    """Whether ``config`` sets a key of ``_PIPELINE_KEYS``."""
    if key == "data.source: treebank":
        return config.data.source == "treebank"
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name) is not None


# ----------------------------------------------------------------------------- loading


def load_config(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    *,
    team_tracking_uri: str | None = None,
) -> RunConfig:
    """Read a YAML run config; errors name the file and the key path. ``team_tracking_uri``:
    the tracking server the process was started with (``RunConfig.team_tracking_uri``)."""
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
        return config_from_dict(data, team_tracking_uri=team_tracking_uri)
    except ConfigError as exc:  # hand-written: only the loader knows which values --set gave
        overrides = overrides or {}
        given = next(
            (k for k in overrides if exc.key == k or exc.key.startswith((f"{k}.", f"{k}["))), None
        )
        where = f"from --set {given}={overrides[given]!r}" if given else f"in {path}"
        raise ConfigError(exc.key, f"{exc.message} ({where})") from None


def config_from_dict(data: dict[str, Any], *, team_tracking_uri: str | None = None) -> RunConfig:
    """Build a RunConfig from plain data (as YAML gives it); ``team_tracking_uri`` as for
    ``load_config``."""
    written, data = data, dict(data)
    if data.get("model") is None:
        data.pop("model", None)
    elif isinstance(data["model"], dict):
        data["model"] = _with_preset(data["model"])
    try:
        blob = json.dumps(data)
    except TypeError as exc:
        raise (not_json(data) or ConfigError("", str(exc))) from None
    _refuse_derived(data)
    refuse_replaced(data.get("train"))
    try:
        config = _adapter().validate_json(blob)
    except ValidationError as exc:
        raise config_error(exc, written, RunConfig) from None
    config = _derived(dataclasses.replace(config, team_tracking_uri=team_tracking_uri))
    if not holds_files(config.workdir) and not (config.mlflow.tracking_uri or team_tracking_uri):
        raise ConfigError(
            "mlflow.tracking_uri",
            f"the work dir {config.workdir} is on an object store, where MLflow's SQLite "
            "database cannot live: set it to a tracking server (or sqlite:////<local "
            "path>/mlflow.db), or set MLFLOW_TRACKING_URI",
        )
    return config


def _derived(config: RunConfig) -> RunConfig:
    """``config`` with the values the loader derives from what it wrote: the work dir resolved
    (``{name}`` replaced, a relative path from the CWD), a relative SQLite registry, parent
    folder (``train.init_from``) and tokenizer files (``tokenizer.model_file``, ``vocab_file``)
    made absolute, the dev and test sets named, the test sets' prefixes absolute. Nothing
    outside is asked."""
    parent = config.train.init_from
    if parent is not None and not parent.startswith("models:"):
        config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, init_from=str(Path(parent).resolve()))
        )
    return dataclasses.replace(
        config,
        workdir=workdir_of(config.workdir, config.name),
        mlflow=config.mlflow.with_absolute_sqlite(),
        data=config.data.with_eval_sets(),
        eval=config.eval.with_absolute_prefixes(),
        tokenizer=config.tokenizer.with_absolute_files(),
    )


def _refuse_derived(data: dict[str, Any]) -> None:
    """A ConfigError for a YAML key that names a derived value (``NOT_A_SETTING``), as for any
    unknown key."""
    for key, value in data.items():
        section = _sections().get(key)
        if key in _derived_names(RunConfig):
            raise ConfigError(key, f"unknown key (known: {', '.join(_settings(RunConfig))})")
        if section is not None and isinstance(value, dict):
            for inner in set(value) & _derived_names(section):
                known = ", ".join(_settings(section))
                raise ConfigError(f"{key}.{inner}", f"unknown key (known: {known})")


def _settings(cls: type) -> list[str]:
    """The names of a config class's settings, its YAML keys."""
    return [f.name for f in dataclasses.fields(cls) if is_setting(f)]


def _derived_names(cls: type) -> set[str]:
    """The names of a config class's derived values (``NOT_A_SETTING``)."""
    return {f.name for f in dataclasses.fields(cls) if not is_setting(f)}


@functools.cache
def _sections() -> dict[str, type]:
    """RunConfig's sections (the fields that are dataclasses), by name."""
    hints = typing.get_type_hints(RunConfig)
    return {name: hint for name, hint in hints.items() if dataclasses.is_dataclass(hint)}


def to_dict(obj: Any) -> Any:
    """Plain, JSON-ready data for a config or section (tuples become lists); its settings only,
    not the values a command derived (``NOT_A_SETTING``)."""
    # Hand-written, not pydantic's dump: every stage fingerprint hashes exactly this form.
    if dataclasses.is_dataclass(obj):
        fields = (f for f in dataclasses.fields(obj) if is_setting(f) and not _omitted(obj, f))
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _omitted(obj: Any, f: dataclasses.Field[Any]) -> bool:
    """Whether a setting added after configs were fingerprinted (``OMITTED_AT_DEFAULT``) is at
    its default, where the plain form leaves it out: the config hashes as before it existed."""
    if not f.metadata.get("omitted_at_default"):
        return False
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return bool(getattr(obj, f.name) == default)


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
