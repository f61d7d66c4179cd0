"""The stage graph: which stages each pipeline runs, what each reads, and where its output lives.

A pipeline is an ordered tuple of ``StageSpec``; each names its stage functions and its inputs
as ``role -> upstream stage``, so the parsing pipeline can hand its linearized corpus to the
same tokenizer and shard stages under the role ``clean``. Every stage folder is
``<workdir>/<stage name>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tasks import (
    average,
    clean,
    download,
    linearize,
    parse_score,
    register,
    score,
    shard,
    tokenizer,
    train,
    translate,
    treebank,
)
from tasks.config import RunConfig
from tasks.contract import (
    StageError,
    StageResult,
    Status,
    accept,
    freshness,
    read_manifest,
    stage_identity,
)


@dataclass(frozen=True)
class StageSpec:
    """One stage of a pipeline."""

    name: str
    """Stage name; also its output folder under the run's root."""
    run: Callable[..., StageResult]
    """``run(config, inputs, *, force=False)``."""
    stage_config: Callable[[RunConfig], dict[str, Any]]
    """What the stage fingerprints besides its inputs."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Input role -> upstream stage name."""
    io_bound: bool = False
    """Talks to the network or a server: the flow retries it."""
    outdated: Callable[[RunConfig, Path], str | None] | None = None
    """Why an output with a matching fingerprint is stale anyway (the stage's ``outdated``)."""


def _spec(name: str, module: Any, inputs: Mapping[str, str] | None = None, **kwargs: Any) -> StageSpec:
    return StageSpec(name, module.run, module.stage_config, dict(inputs or {}), **kwargs)


WMT14: tuple[StageSpec, ...] = (
    _spec("download", download, io_bound=True),
    _spec("clean", clean, {"download": "download"}),
    _spec("tokenizer", tokenizer, {"clean": "clean"}),
    _spec("shard", shard, {"clean": "clean", "tokenizer": "tokenizer"}),
    _spec("train", train, {"shard": "shard", "tokenizer": "tokenizer"}),
    _spec("average", average, {"train": "train"}),
    _spec("translate", translate, {"average": "average", "tokenizer": "tokenizer", "download": "download"}),
    _spec("score", score, {"translate": "translate", "download": "download"}),
    _spec(
        "register", register, {"average": "average", "tokenizer": "tokenizer", "score": "score"},
        io_bound=True, outdated=register.outdated,
    ),
)

PARSING: tuple[StageSpec, ...] = (
    _spec("treebank", treebank),
    _spec("linearize", linearize, {"treebank": "treebank"}),
    _spec("tokenizer", tokenizer, {"clean": "linearize"}),
    _spec("shard", shard, {"clean": "linearize", "tokenizer": "tokenizer"}),
    _spec("train", train, {"shard": "shard", "tokenizer": "tokenizer"}),
    _spec("average", average, {"train": "train"}),
    _spec("translate", translate, {"average": "average", "tokenizer": "tokenizer", "download": "linearize"}),
    _spec("parse_score", parse_score, {"translate": "translate", "linearize": "linearize"}),
)

PIPELINES: dict[str, tuple[StageSpec, ...]] = {"wmt14": WMT14, "parsing": PARSING}


def pipeline_name(config: RunConfig) -> str:
    """``parsing`` for treebank data, ``wmt14`` for every translation source."""
    return "parsing" if config.data.source == "treebank" else "wmt14"


def pipeline(config: RunConfig) -> tuple[StageSpec, ...]:
    """The stages this config runs, in order."""
    return PIPELINES[pipeline_name(config)]


def spec(config: RunConfig, name: str) -> StageSpec:
    """The named stage of this config's pipeline; a clear error for an unknown name."""
    for s in pipeline(config):
        if s.name == name:
            return s
    names = ", ".join(s.name for s in pipeline(config))
    raise StageError(f"unknown stage {name!r} for the {pipeline_name(config)} pipeline; stages: {names}")


def output_dir(config: RunConfig, name: str) -> Path:
    """Where stage ``name`` writes its artifact folder."""
    return config.root / name


def inputs_of(config: RunConfig, stage: StageSpec) -> dict[str, Path]:
    """Input role -> upstream artifact folder."""
    return {role: output_dir(config, up) for role, up in stage.inputs.items()}


def run_one(config: RunConfig, name: str, *, force: bool | str = False) -> StageResult:
    """Run one stage by name (its inputs must exist); ``force`` as ``run_stage`` takes it. An
    error leaving it carries the note ``stage <name> failed`` (the command line prints it with
    the error's one line)."""
    s = spec(config, name)
    try:
        return s.run(config, inputs_of(config, s), force=force)
    except Exception as exc:
        exc.add_note(f"stage {name} failed")
        raise


def accept_one(config: RunConfig, name: str) -> StageResult:
    """Keep stage ``name``'s output for the current config, inputs and code without running it
    (``contract.accept``: recorded in its manifest)."""
    s = spec(config, name)
    return accept(s.name, output_dir(config, s.name), s.stage_config(config), inputs_of(config, s))


def status(config: RunConfig, *, full: bool = False) -> list[tuple[str, Status]]:
    """Each stage: up to date, stale or missing, and why (without running anything); ``full``
    checks every file's sha256, not only the small files'."""
    result: list[tuple[str, Status]] = []
    fresh: dict[str, bool] = {}
    for s in pipeline(config):
        folder = output_dir(config, s.name)
        stale_inputs = [up for up in s.inputs.values() if not fresh.get(up, False)]
        if stale_inputs:
            state = "missing" if not folder.exists() else "stale"
            st = Status(state, f"waits for {', '.join(dict.fromkeys(stale_inputs))}")
        else:
            input_fps = {
                role: read_manifest(path)["fingerprint"] for role, path in inputs_of(config, s).items()
            }
            outdated = partial(s.outdated, config) if s.outdated else None
            identity = stage_identity(s.name, s.stage_config(config), input_fps)
            st = freshness(folder, identity, outdated=outdated, full=full)
        fresh[s.name] = st.up_to_date
        result.append((s.name, st))
    return result
