"""The stage graph: which stages each pipeline runs, what each reads, and where its output lives.

A pipeline is an ordered tuple of ``StageSpec``; each names its stage and its inputs as
``role -> upstream stage``, so the parsing pipeline can hand its linearized corpus to the same
tokenizer and shard stages under the role ``clean``, and the distill pipeline its filtered
translations. Stage ``x`` is the module ``tasks.x``
(``stage_module``), found by its name as the code fingerprint finds it, so the framework
imports no stage: the stages import the framework. Every stage folder is
``<workdir>/<stage name>``, so pipelines that share stage names (tokenizer, shard, train, ...)
run in work dirs of their own: each config names its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from tasks.framework.code_fingerprint import STAGES
from tasks.framework.config import PipelineName, RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError
from tasks.framework.workdir import WorkDir


class StageModule(Protocol):
    """What a stage module defines (and, where it has them, ``outdated(config, folder)``,
    ``resolve(config)`` and ``looked_up(config, manifest)``: ``StageSpec``'s)."""

    def stage_config(self, config: RunConfig) -> dict[str, Any]:
        """What the stage fingerprints besides its inputs."""
        ...

    def build(self, ctx: BuildContext, **options: Any) -> Mapping[str, Any] | None:
        """Write the output into ``ctx.tmp``; its stats. ``options``: train's ``callbacks``."""
        ...


def stage_module(name: str) -> StageModule:
    """The module of stage ``name`` (``tasks.<name>``): its ``stage_config``, ``build`` and,
    where it has one, ``outdated``."""
    # Found by name (the framework imports no stage), so the checker takes the protocol's word.
    return cast(StageModule, importlib.import_module(f"{STAGES}.{name}"))


@dataclass(frozen=True)
class StageSpec:
    """One stage of a pipeline: its name and what it reads; the rest is its module's."""

    name: str
    """Stage name: its module ``tasks.<name>`` and its output folder under the run's root."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Input role -> upstream stage name."""
    io_bound: bool = False
    """Talks to the network or a server: the flow retries it."""
    wanted: Callable[[RunConfig], bool] | None = None
    """Whether a config runs the stage at all (None: every config of the pipeline does)."""
    optional: frozenset[str] = frozenset()
    """Input roles read only where their stage runs; a config that does not run it gives this
    stage no such input (register reads the evaluate stage's sets where there is one)."""
    replaces: str | None = None
    """When the config runs it, the stages after it read it in place of this stage (holdout:
    the clean corpus less the held-out test sets)."""

    def stage_config(self, config: RunConfig) -> dict[str, Any]:
        """What the stage fingerprints besides its inputs (the module's ``stage_config``)."""
        return stage_module(self.name).stage_config(config)

    def build(self, ctx: BuildContext, **options: object) -> Mapping[str, Any] | None:
        """Write the stage's output into ``ctx.tmp``; its stats (the module's ``build``)."""
        return stage_module(self.name).build(ctx, **options)

    def outdated(self, config: RunConfig, folder: Path) -> str | None:
        """Why an output with a matching fingerprint is stale anyway (the module's
        ``outdated``: register's registry version that is gone); None for most stages."""
        rule = getattr(stage_module(self.name), "outdated", None)
        return None if rule is None else rule(config, folder)

    def resolve(self, config: RunConfig) -> RunConfig:
        """``config`` with what the stage needs from outside resolved, asked once before it
        runs (the module's ``resolve``: the teacher's registry version); most stages need
        nothing, and building a config asks nothing."""
        rule = getattr(stage_module(self.name), "resolve", None)
        return config if rule is None else rule(config)

    def looked_up(self, config: RunConfig, workdir: WorkDir) -> tuple[RunConfig, str | None]:
        """``config`` as ``tfm status`` judges the stage (the module's ``looked_up``, given the
        stage folder's manifest in ``workdir``): resolved where the world answers, else as the
        folder records it; and what could not be resolved, in words (None: all was)."""
        rule = getattr(stage_module(self.name), "looked_up", None)
        return (config, None) if rule is None else rule(config, workdir.manifest(self.name))


def _trained(corpus: str) -> tuple[StageSpec, ...]:
    """The stages every translation-like pipeline shares, on the corpus stage ``corpus`` wrote
    (in the role ``clean``): tokenizer, shard, train, average, translate."""
    return (
        StageSpec("tokenizer", {"clean": corpus}, wanted=_trains_tokenizer),
        StageSpec("shard", {"clean": corpus, "tokenizer": "tokenizer"}),
        StageSpec("train", {"shard": "shard", "tokenizer": "tokenizer"}),
        StageSpec("average", {"train": "train"}),
        StageSpec("translate", {"average": "average", "tokenizer": "tokenizer", "shard": "shard"}),
    )


def _trains_tokenizer(config: RunConfig) -> bool:
    """Whether the run trains its tokenizer: a fine-tuning takes its parent's."""
    return config.train.init_from is None


def _fine_tunes(config: RunConfig) -> bool:
    """Whether training starts from a parent's weights (``train.init_from``)."""
    return config.train.init_from is not None


_PARENT = StageSpec("parent", io_bound=True, wanted=_fine_tunes, replaces="tokenizer")
"""A fine-tuning's parent (``train.init_from``), pinned as the flow starts: its folder holds the
parent's tokenizer and weights, and the stages after it read it as the tokenizer's (the train
stage its weights too)."""


def _holds_out_sets(config: RunConfig) -> bool:
    """Whether ``eval.test_sets`` holds sets out of training besides the primary one."""
    return bool(config.eval.held_out)


_DOWNLOAD = StageSpec("download", io_bound=True)
_CLEAN = StageSpec("clean", {"download": "download"})
_HOLDOUT = StageSpec(
    "holdout", {"clean": "clean"}, io_bound=True, wanted=_holds_out_sets, replaces="clean"
)
"""The clean corpus less the pairs of the test sets held out (``eval.test_sets``' holdout), for a
config that holds any out: the stages after it read it as clean; io_bound: a built-in set is
fetched."""
_SCORE = StageSpec("score", {"translate": "translate", "download": "download"})
_REGISTERED = {"average": "average", "tokenizer": "tokenizer", "score": "score"}
"""What register reads of a trained model: its weights, tokenizer and scores ..."""


def _register(**more: str) -> StageSpec:
    """... and the evaluate stage's sets where the config has them (the evidence a later
    candidate is compared with), and ``more``; io_bound: it needs the registry."""
    inputs = {**_REGISTERED, "evaluate": "evaluate", **more}
    return StageSpec("register", inputs, io_bound=True, optional=frozenset({"evaluate"}))


def _evaluate(corpus: str) -> StageSpec:
    """The evaluate stage: the averaged model on every test set (``eval.test_sets``), the primary
    one's figures read from score, the others' overlap with the training split of ``corpus``;
    io_bound: a built-in set is fetched."""
    inputs = {"average": "average", "tokenizer": "tokenizer", "score": "score", "clean": corpus}
    return StageSpec("evaluate", inputs, io_bound=True, wanted=_has_extra_test_sets)


def _has_extra_test_sets(config: RunConfig) -> bool:
    """Whether ``eval.test_sets`` lists sets besides the primary one (a config without them
    runs the stages it ran before the evaluate stage existed)."""
    return bool(config.eval.extra)


WMT14: tuple[StageSpec, ...] = (
    _PARENT,
    _DOWNLOAD,
    _CLEAN,
    _HOLDOUT,
    *_trained("clean"),
    _SCORE,
    _evaluate("clean"),
    _register(),
)

PARSING: tuple[StageSpec, ...] = (
    _PARENT,
    StageSpec("treebank"),
    StageSpec("linearize", {"treebank": "treebank"}),
    *_trained("linearize"),
    StageSpec("parse_score", {"translate": "translate", "linearize": "linearize"}),
)

FAIRSEQ: tuple[StageSpec, ...] = (
    StageSpec("fairseq_import"),
    # The import's folder holds the model and its tokenizer; nothing scored it.
    StageSpec(
        "register", {"average": "fairseq_import", "tokenizer": "fairseq_import"}, io_bound=True
    ),
)

DISTILL: tuple[StageSpec, ...] = (
    StageSpec("teacher", io_bound=True),
    _PARENT,
    _DOWNLOAD,
    _CLEAN,
    _HOLDOUT,
    StageSpec("distill", {"teacher": "teacher", "clean": "clean"}),
    StageSpec("filter", {"distill": "distill", "clean": "clean"}),
    *_trained("filter"),
    _SCORE,
    _evaluate("filter"),
    StageSpec("export", {"average": "average", "tokenizer": "tokenizer"}),
    _register(teacher="teacher"),
)
"""Sequence-level distillation: a registered teacher's translations of the training corpus
(``distill``, less the worst ``filter`` drops) take the clean corpus's role for the usual
stages, which train, score, export and register the student."""

PIPELINES: dict[PipelineName, tuple[StageSpec, ...]] = {
    "wmt14": WMT14,
    "parsing": PARSING,
    "fairseq": FAIRSEQ,
    "distill": DISTILL,
}
"""Each pipeline by the name a config's ``pipeline`` gives (``RunConfig.pipeline_name``)."""


def pipeline_name(config: RunConfig) -> PipelineName:
    """The pipeline ``config`` runs: its ``pipeline``, else the one its keys name (``fairseq``
    for a fairseq checkpoint, ``parsing`` for treebank data, ``distill`` for a teacher), else
    ``wmt14`` (every translation config)."""
    return config.pipeline_name


def pipeline(config: RunConfig) -> tuple[StageSpec, ...]:
    """The stages this config runs, in order (its pipeline's, less those it does not want)."""
    stages = PIPELINES[pipeline_name(config)]
    kept = [s for s in stages if s.wanted is None or s.wanted(config)]
    if len(kept) == len(stages) and all(s.replaces is None for s in kept):
        return stages
    out: list[StageSpec] = []
    read_as: dict[str, str] = {}  # a replaced stage -> the stage read in its place
    running = {s.name for s in kept}
    for s in kept:
        inputs = {
            role: read_as.get(up, up)
            for role, up in s.inputs.items()
            if up in running or role not in s.optional
        }
        out.append(s if inputs == s.inputs else dataclasses.replace(s, inputs=inputs))
        if s.replaces is not None:
            read_as[s.replaces] = s.name
    return tuple(out)


def spec(config: RunConfig, name: str) -> StageSpec:
    """The named stage of this config's pipeline; a clear error for an unknown name."""
    for s in pipeline(config):
        if s.name == name:
            return s
    names = ", ".join(s.name for s in pipeline(config))
    raise StageError(
        f"unknown stage {name!r} for the {pipeline_name(config)} pipeline; stages: {names}"
    )
