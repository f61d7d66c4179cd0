"""The run config's stage-only sections: where the corpus comes from, averaging, the registry,
tracking, Ray, parsing, distillation and the export. The libraries' sections (``ModelConfig``,
``CleanConfig``, ``TokenizerConfig``, ``ShardConfig``, ``TrainConfig``, ``DecodeConfig``) live
with their libraries; ``tasks.framework.config`` composes them all into ``RunConfig``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Lt
from pydantic import AfterValidator

from corpora import CorpusError
from corpora.sources import (
    STANDARD_EVAL,
    multi30k_eval_set,
    multi30k_train,
    split_pair,
    train_corpora,
)
from corpora.synthetic import PAIRS as SYNTHETIC_PAIRS
from evaluation.bleu import METRICS
from parsing.linearize import Form
from serving.ct2_options import Quantization
from serving.decode_config import DecodeConfig
from transformer_core.config_checks import OMITTED_AT_DEFAULT, ConfigError
from transformer_core.search_settings import BeamSettings

__all__ = [
    "DataConfig",
    "AverageConfig",
    "RegisterConfig",
    "MlflowConfig",
    "RayConfig",
    "ParsingConfig",
    "FairseqConfig",
    "DistillConfig",
    "ExportConfig",
    "ModelReference",
    "TeacherPin",
    "NOT_A_SETTING",
    "is_setting",
]

NOT_A_SETTING = {"setting": False}
"""A field's metadata for a value a command derives and carries with the config (the team's
tracking server, a chosen port, a pinned teacher): no YAML key, never hashed nor logged."""


def is_setting(f: dataclasses.Field[Any]) -> bool:
    """Whether a config field is a setting (a YAML key), not a value a command derived."""
    return bool(f.metadata.get("setting", True))


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the parallel corpus comes from (download stage)."""

    source: Literal["synthetic", "wmt14", "multi30k", "local", "treebank"] = "synthetic"
    """synthetic: the offline grammar corpus; wmt14: statmt.org or a mirror; multi30k: Multi30k
    task 1; local: your own files in local_dir (docs/your-data.md); treebank: PTB files."""
    pair: str = "en-de"
    """Language pair as src-tgt, e.g. en-de or en-fr (multi30k: two of en, de, fr, cs)."""
    corpora: tuple[str, ...] = ()
    """Training corpora names from the source registry; empty means the registry's default set
    (multi30k: leave empty)."""
    dev: str | None = None
    """Development set name; null means the source's standard: newstest2013 (wmt14), val
    (multi30k), the local_dev prefix's name (local)."""
    test: str | None = None
    """Test set name, as scores and MLflow report it; null means the source's standard: newstest2014
    (wmt14; release: test_variant), test_2016_flickr (multi30k), the local_test prefix's name
    (local)."""
    test_variant: Literal["full", "filtered"] = "full"
    """newstest2014 release: full (3,003 segments) or filtered (2,737); Multi30k test sets have one
    (full)."""
    mirror: str | None = None
    """A file:// folder or http(s):// base replacing statmt.org (multi30k: the repository root);
    offline clusters, tests."""
    local_dir: str | None = None
    """For source=local: the folder holding each prefix's text, as two line-aligned files
    <prefix>.<src> and <prefix>.<tgt> (either may be gzipped: <prefix>.<lang>.gz) or as one
    two-column TSV <prefix>.tsv[.gz] of source<TAB>target lines, in the pair's order."""
    max_retries: Annotated[int, Ge(1)] = 5
    """Download attempts per file before giving up (exponential backoff between them)."""
    cache_dir: str | None = None
    """Where downloaded archives are kept between runs; null means <workdir>/cache/downloads."""
    lock_file: str | None = None
    """JSON file pinning each download's sha256 and size when first seen; null means
    <workdir>/downloads.lock.json."""
    local_train: tuple[str, ...] = ("train",)
    """For source=local: training file prefixes in local_dir (see local_dir; the prefix's last
    part names the corpus)."""
    local_dev: str = "dev"
    """For source=local: dev file prefix in local_dir (see local_dir)."""
    local_test: str = "test"
    """For source=local: test file prefix in local_dir (see local_dir)."""
    synthetic_train: int = 20000
    """For source=synthetic: number of training pairs."""
    synthetic_dev: int = 500
    """For source=synthetic: number of dev pairs."""
    synthetic_test: int = 500
    """For source=synthetic: number of test pairs."""
    synthetic_domain: Literal["office"] | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    """For source=synthetic: a domain whose nouns (office: engineers, printers, invoices) fill
    most noun slots, to adapt the quickstart's model to (docs/fine-tuning.md); none: general."""

    def __post_init__(self) -> None:
        # Rules between fields (the pair a source can make, its dev and test sets), which a
        # field's own constraint cannot say.
        try:
            split_pair(self.pair)
        except ValueError as exc:
            raise ConfigError("pair", str(exc)) from None
        if self.source == "treebank" and self.pair != "words-tree":
            raise ConfigError(
                "pair",
                f"{self.pair!r}: the parsing pipeline's pair is words-tree (words in, trees out)",
            )
        if self.synthetic_domain is not None and self.source != "synthetic":
            raise ConfigError("synthetic_domain", f"is for source synthetic, not {self.source}")
        if self.source == "multi30k":
            self._check_multi30k()
        elif self.source == "synthetic" and self.pair not in SYNTHETIC_PAIRS:
            raise ConfigError(
                "pair",
                f"{self.pair!r}: the synthetic corpus is English-German "
                f"({' or '.join(SYNTHETIC_PAIRS)})",
            )
        elif self.source == "wmt14":
            try:
                train_corpora(self.pair, self.corpora)
            except CorpusError as exc:
                raise ConfigError(
                    "corpora" if "unknown corpus" in str(exc) else "pair", str(exc)
                ) from None

    @property
    def eval_sets(self) -> tuple[str, str]:
        """The dev and test sets' names: ``dev`` and ``test``, else the source's standard ones
        (a local corpus's are its prefixes' names; synthetic and treebank keep WMT14's)."""
        if self.source == "local":
            dev, test = PurePath(self.local_dev).name, PurePath(self.local_test).name
        else:
            dev, test = STANDARD_EVAL.get(self.source, STANDARD_EVAL["wmt14"])
        return self.dev or dev, self.test or test

    def with_eval_sets(self) -> DataConfig:
        """A copy naming its dev and test sets (``eval_sets``): what the loader keeps, so every
        stage, fingerprint and logged parameter sees the same names."""
        dev, test = self.eval_sets
        return dataclasses.replace(self, dev=dev, test=test)

    def _check_multi30k(self) -> None:
        """The pair's languages and the dev and test sets must be Multi30k's."""
        if self.corpora:
            raise ConfigError(
                "corpora",
                f"{list(self.corpora)}: Multi30k has one training corpus; leave data.corpora empty",
            )
        if self.test_variant != "full":
            raise ConfigError(
                "test_variant",
                f"{self.test_variant!r} is a newstest2014 release; "
                "Multi30k test sets have one (full)",
            )
        try:
            multi30k_train(self.pair)
        except CorpusError as exc:
            raise ConfigError("pair", str(exc)) from None
        for key, name in zip(("dev", "test"), self.eval_sets, strict=True):
            try:
                multi30k_eval_set(name, self.pair)
            except CorpusError as exc:
                raise ConfigError(key, str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class AverageConfig:
    """Checkpoint averaging (paper section 6.1)."""

    last: Annotated[int, Ge(1)] = 5
    """Number of checkpoints averaged (base 5, big 20)."""
    spacing: Literal["step", "time"] = "step"
    """Pick the last N by step, or the last N spaced by checkpoint_minutes (the paper's way)."""
    select: Literal["last", "best"] = "last"
    """last: average the last N checkpoints (the paper); best: take the best checkpoint by dev
    BLEU alone (needs train.bleu_sentences; with train.patience the last ones are past it)."""


def _score_metric(name: str) -> str:
    """One of the metrics the score stage writes (``evaluation.bleu.METRICS``)."""
    if name not in METRICS:
        raise ValueError(f"{name!r} is not one of {', '.join(METRICS)}")
    return name


ScoreMetric = Annotated[str, AfterValidator(_score_metric)]
"""A metric the score stage writes to scores.json (``evaluation.bleu.METRICS``)."""


@dataclass(frozen=True, kw_only=True)
class RegisterConfig:
    """The MLflow model registry."""

    model_name: str = "transformer-translator"
    """Registered model name."""
    metric: ScoreMetric = "bleu_sacre"
    """Metric of scores.json that decides whether a new version takes the champion alias; a
    lowercasing recipe compares ``bleu_tok_lc``."""
    rule: Literal["evidence", "higher"] = "evidence"
    """How the champion is chosen. evidence: a new version takes the alias when it beats the
    champion on the primary test set by a paired bootstrap test with p below max_p and is not
    significantly worse on any other test set both were judged on (docs/evaluation.md); higher:
    when its metric on the primary set is higher, one figure against another."""
    max_p: Annotated[float, Gt(0), Lt(1)] = 0.05
    """The evidence rule's threshold: the p-value below which a difference counts, better on
    the primary set or worse on another."""


SQLITE = "sqlite:///"
"""A SQLite tracking store's URI prefix; the database's path follows (absolute: a fourth /)."""


@dataclass(frozen=True, kw_only=True)
class FairseqConfig:
    """A fairseq model to import instead of training one (tfm import fairseq)."""

    checkpoint: str | None = None
    """A fairseq transformer checkpoint; set, the run is the fairseq pipeline (fairseq_import,
    register), and the text is prepared as the tokenizer section says before its BPE."""
    dict_dir: str | None = None
    """The folder of its joined dictionary, dict.<src>.txt and dict.<tgt>.txt (fairseq-preprocess
    --joined-dictionary)."""
    bpe_codes: str | None = None
    """Its subword-nmt BPE codes file (subword-nmt learn-bpe)."""

    def __post_init__(self) -> None:
        if self.checkpoint is not None:
            for name in ("dict_dir", "bpe_codes"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "is needed with fairseq.checkpoint")


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    """Experiment tracking."""

    tracking_uri: str | None = None
    """Tracking server; null means MLFLOW_TRACKING_URI if set, else
    sqlite:///<workdir>/mlflow.db. A relative SQLite path (sqlite:///runs/x/mlflow.db: another
    run's registry) is from the CWD at load, where it is resolved once, as the work dir is."""
    experiment: str = "transformer"
    """Experiment name."""
    http_retries: Annotated[int, Ge(0)] = 2
    """MLflow HTTP retries per call of the tracking sender and of register (MLflow's default, 7,
    waits up to 254 s)."""
    http_backoff: Annotated[int, Ge(0)] = 1
    """MLflow HTTP backoff factor for those calls (MLflow's default: 2)."""
    http_timeout: Annotated[int, Ge(1)] = 10
    """Seconds those calls wait for one HTTP answer (MLflow's default: 120)."""
    probe_seconds: Annotated[float, Gt(0)] = 2.0
    """While the server does not answer, seconds between two tries of the tracking sender."""
    drain_seconds: Annotated[float, Ge(0)] = 60.0
    """At the end of training and of a command, seconds to wait for the tracking journals to reach a
    server that answers (the rest is sent by the next command, or `tfm tracking replay`)."""
    registry_wait_seconds: Annotated[float, Ge(0)] = 300.0
    """How long register waits for a server that does not answer before it fails (the other stages
    never wait; docs/training.md, "When the tracking server is down")."""

    def with_absolute_sqlite(self) -> MlflowConfig:
        """A copy whose relative SQLite path is absolute, from the CWD (what the loader keeps):
        every process of the run (Ray's workers start elsewhere) opens the same database."""
        uri = self.tracking_uri
        if uri is None or not uri.startswith(SQLITE) or uri[len(SQLITE) :].startswith("/"):
            return self
        return dataclasses.replace(
            self, tracking_uri=SQLITE + str(Path(uri[len(SQLITE) :]).resolve())
        )


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Where Ray runs."""

    address: str | None = None
    """Cluster address; null means RAY_ADDRESS or a local Ray started by the stage."""
    num_cpus: int | None = None
    """CPUs for a local Ray (null: all)."""
    dashboard: bool = True
    """Start the dashboard with a local Ray (on 127.0.0.1): Ray Train's cleanup uses its State
    API."""
    loopback: bool = True
    """A local Ray binds every port it opens to 127.0.0.1; false: to the machine's address."""
    dashboard_port: int | None = field(
        default=None, compare=False, repr=False, metadata=NOT_A_SETTING
    )
    """The port a command chose for its local Ray's dashboard, where the environment it set
    names the State API (``pipelines.environment``); None: Ray's own. Not a setting (never
    hashed nor logged)."""

    def with_dashboard_port(self, port: int | None) -> RayConfig:
        """A copy whose local Ray serves its dashboard on ``port``."""
        return dataclasses.replace(self, dashboard_port=port)


def _relative_glob(pattern: str) -> str:
    """Each a glob relative to ``treebank_dir`` (not empty, not absolute, no ``..``)."""
    if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        raise ValueError(f"{pattern!r} must be a glob relative to treebank_dir")
    return pattern


RelativeGlob = Annotated[str, AfterValidator(_relative_glob)]
"""A glob pattern under the treebank folder: not empty, not absolute, no ``..``."""


@dataclass(frozen=True, kw_only=True)
class ParsingConfig(BeamSettings):
    """English constituency parsing (paper section 6.3): treebank, splits, target form, and the
    decoding settings every search shares (``BeamSettings``), with the paper's parsing values."""

    beam_size: int = 21
    """Beam width for parsing (the paper: 21)."""
    alpha: float = 0.3
    """Length penalty exponent for parsing (the paper: 0.3)."""
    max_len_offset: int = 300
    """Maximum output length = input length + this (the paper: 300)."""
    treebank_dir: str | None = None
    """Treebank root, e.g. a licensed LDC99T42 copy's parsed/mrg/wsj (holding 00/ ... 24/); null
    means NLTK's WSJ sample, nltk_data/corpora/treebank/combined in the first NLTK data folder
    that holds it (`python -m nltk.downloader treebank` puts it there), found by the treebank
    stage."""
    train_files: tuple[RelativeGlob, ...] = ("0[2-9]/*.mrg", "1[0-9]/*.mrg", "2[01]/*.mrg")
    """Glob patterns under treebank_dir for training trees (default: WSJ sections 02-21)."""
    dev_files: tuple[RelativeGlob, ...] = ("22/*.mrg",)
    """Glob patterns for development trees (default: WSJ section 22); empty for none."""
    test_files: tuple[RelativeGlob, ...] = ("23/*.mrg",)
    """Glob patterns for test trees (default: WSJ section 23)."""
    form: Form = "t2t"
    """Target form: t2t (tags kept, closing brackets labelled, as the paper), vinyals (tags as XX)
    or words (each word written before its tag)."""
    constrained: bool = False
    """Beam search keeps every hypothesis a well-formed tree with one POS slot per word (needs
    tokenizer.target_symbols)."""
    evalb_max_error: Annotated[int, Ge(0)] | None = 10
    """EVALB's MAX_ERROR: parse_score fails, as EVALB gives up, at error sentence number this + 2;
    null scores them all."""
    silver_corpus: str | None = None
    """Semi-supervised setting: a file of extra (silver) trees added to the training split."""


MODELS_SCHEME = "models:/"


@dataclass(frozen=True)
class ModelReference:
    """A registered model by version or by alias: ``models:/<name>/<version>`` or
    ``models:/<name>@<alias>`` (MLflow's model URIs)."""

    name: str
    version: int | None = None
    alias: str | None = None

    @classmethod
    def parse(cls, uri: str) -> ModelReference:
        """The reference ``uri`` writes; a ValueError saying the two forms otherwise."""
        forms = f"{uri!r} is not models:/<name>/<version> nor models:/<name>@<alias>"
        if not uri.startswith(MODELS_SCHEME):
            raise ValueError(forms)
        rest = uri[len(MODELS_SCHEME) :]
        if "@" in rest:
            name, _, alias = rest.partition("@")
            if name and alias and "/" not in name + alias:
                return cls(name, alias=alias)
        else:
            name, _, version = rest.partition("/")
            if name and version.isdigit() and int(version) >= 1:
                return cls(name, version=int(version))
        raise ValueError(forms)

    def __str__(self) -> str:
        if self.alias is not None:
            return f"{MODELS_SCHEME}{self.name}@{self.alias}"
        return f"{MODELS_SCHEME}{self.name}/{self.version}"


def _model_uri(uri: str) -> str:
    """A registered model's URI: models:/<name>/<version> or models:/<name>@<alias>."""
    ModelReference.parse(uri)
    return uri


ModelUri = Annotated[str, AfterValidator(_model_uri)]
"""A registered model's URI by version or alias (``ModelReference``)."""


@dataclass(frozen=True)
class TeacherPin:
    """The registry version a model reference named when it was resolved: a distillation's
    teacher, a fine-tuning's parent (which, given as a folder, has version 0 and its path for
    a name)."""

    name: str
    version: int
    weights_sha256: str
    run_id: str
    found_by: str
    """The reference as the config wrote it (``models:/name@champion``)."""


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Sequence-level knowledge distillation (Kim and Rush 2016; docs/distillation.md): a
    registered teacher translates the training corpus, and the student trains on that."""

    teacher: ModelUri | None = None
    """The registered teacher, models:/<name>@<alias> or models:/<name>/<version>, in the run's
    registry (mlflow.tracking_uri); set, the config runs the distill pipeline. The teacher stage
    resolves the alias to one version when it runs (the flow's first stage), and the run keeps
    that version however the alias moves."""
    decode: DecodeConfig | None = None
    """How the teacher translates the corpus; null: as it was registered (its decoding)."""
    rows_per_shard: Annotated[int, Ge(1)] = 2000
    """Source sentences per distilled shard: the unit a killed run resumes by."""
    drop_share: Annotated[float, Ge(0), Lt(1)] = 0.05
    """The share of pairs the filter stage drops: those whose translation the teacher scored
    lowest (mean log-probability per token)."""
    max_failures: Annotated[int, Ge(0)] = 1
    """Times the distill stage starts its translators again on the shards not yet written
    when one of them died (a killed worker's batches are redone)."""
    pinned: TeacherPin | None = field(
        default=None, compare=False, repr=False, metadata=NOT_A_SETTING
    )
    """The registry version ``teacher`` named when the teacher stage was about to run (its
    ``resolve``), or as the stage's folder records it (``tfm status``); None: not resolved.
    Not a setting (never hashed nor logged)."""


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """The export stage (the distill pipeline): the averaged model as a CTranslate2 folder."""

    quantization: Quantization = "int8"
    """The weights' type in the export: int8 (what distilled students ship as), int8_float16,
    float16, bfloat16, float32, ... (``tfm export --quantization`` defaults to float32
    instead: an export by hand keeps the model's own outputs unless asked)."""
