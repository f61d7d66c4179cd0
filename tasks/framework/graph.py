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

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from tasks.framework.code_fingerprint import STAGES
from tasks.framework.config import RunConfig
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


WMT14: tuple[StageSpec, ...] = (
    StageSpec("download", io_bound=True),
    StageSpec("clean", {"download": "download"}),
    StageSpec("tokenizer", {"clean": "clean"}),
    StageSpec("shard", {"clean": "clean", "tokenizer": "tokenizer"}),
    StageSpec("train", {"shard": "shard", "tokenizer": "tokenizer"}),
    StageSpec("average", {"train": "train"}),
    StageSpec("translate", {"average": "average", "tokenizer": "tokenizer", "shard": "shard"}),
    StageSpec("score", {"translate": "translate", "download": "download"}),
    StageSpec(
        "register",
        {"average": "average", "tokenizer": "tokenizer", "score": "score"},
        io_bound=True,
    ),
)

PARSING: tuple[StageSpec, ...] = (
    StageSpec("treebank"),
    StageSpec("linearize", {"treebank": "treebank"}),
    StageSpec("tokenizer", {"clean": "linearize"}),
    StageSpec("shard", {"clean": "linearize", "tokenizer": "tokenizer"}),
    StageSpec("train", {"shard": "shard", "tokenizer": "tokenizer"}),
    StageSpec("average", {"train": "train"}),
    StageSpec("translate", {"average": "average", "tokenizer": "tokenizer", "shard": "shard"}),
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
    StageSpec("download", io_bound=True),
    StageSpec("clean", {"download": "download"}),
    StageSpec("distill", {"teacher": "teacher", "clean": "clean"}),
    StageSpec("filter", {"distill": "distill", "clean": "clean"}),
    StageSpec("tokenizer", {"clean": "filter"}),
    StageSpec("shard", {"clean": "filter", "tokenizer": "tokenizer"}),
    StageSpec("train", {"shard": "shard", "tokenizer": "tokenizer"}),
    StageSpec("average", {"train": "train"}),
    StageSpec("translate", {"average": "average", "tokenizer": "tokenizer", "shard": "shard"}),
    StageSpec("score", {"translate": "translate", "download": "download"}),
    StageSpec("export", {"average": "average", "tokenizer": "tokenizer"}),
    StageSpec(
        "register",
        {"average": "average", "tokenizer": "tokenizer", "score": "score", "teacher": "teacher"},
        io_bound=True,
    ),
)
"""Sequence-level distillation: a registered teacher's translations of the training corpus
(``distill``, less the worst ``filter`` drops) take the clean corpus's role for the usual
stages, which train, score, export and register the student."""

PIPELINES: dict[str, tuple[StageSpec, ...]] = {
    "wmt14": WMT14,
    "parsing": PARSING,
    "fairseq": FAIRSEQ,
    "distill": DISTILL,
}


def pipeline_name(config: RunConfig) -> str:
    """``fairseq`` for a config that names a fairseq checkpoint, ``parsing`` for treebank data,
    ``distill`` for a config with a teacher (``distill.teacher``), ``wmt14`` for every other
    translation config."""
    if config.fairseq.checkpoint is not None:
        return "fairseq"
    if config.data.source == "treebank":
        return "parsing"
    return "distill" if config.distill.teacher is not None else "wmt14"


def pipeline(config: RunConfig) -> tuple[StageSpec, ...]:
    """The stages this config runs, in order."""
    return PIPELINES[pipeline_name(config)]


def spec(config: RunConfig, name: str) -> StageSpec:
    """The named stage of this config's pipeline; a clear error for an unknown name."""
    for s in pipeline(config):
        if s.name == name:
            return s
    names = ", ".join(s.name for s in pipeline(config))
    raise StageError(
        f"unknown stage {name!r} for the {pipeline_name(config)} pipeline; stages: {names}"
    )
