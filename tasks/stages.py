"""The stage graph: which stages a pipeline runs, what each reads, and where its output lives.

Stages are plain functions ``tasks.<module>.run(config, inputs, *, force) -> Path``. A pipeline
is an ordered tuple of ``StageSpec``; each names its inputs as ``role -> upstream stage``, so the
parsing pipeline can hand its linearized corpus to the same tokenizer and shard stages under the
role ``clean``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.artifacts import StageError, Status, check, read_manifest, stage_fingerprint
from tasks.config import RunConfig


@dataclass(frozen=True)
class StageSpec:
    """One stage of a pipeline."""

    name: str
    """Stage name; also its output folder under the run's root."""
    module: str
    """Module whose ``run(config, inputs, *, force)`` runs the stage."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Input role -> upstream stage name."""
    io_bound: bool = False
    """Talks to the network or a server: the flow retries it."""


WMT14: tuple[StageSpec, ...] = (
    StageSpec("download", "tasks.download", io_bound=True),
    StageSpec("clean", "tasks.clean", {"download": "download"}),
    StageSpec("tokenizer", "tasks.tokenizer", {"clean": "clean"}),
    StageSpec("shard", "tasks.shard", {"clean": "clean", "tokenizer": "tokenizer"}),
    StageSpec("train", "tasks.train", {"shard": "shard", "tokenizer": "tokenizer"}),
    StageSpec("average", "tasks.average", {"train": "train"}),
    StageSpec(
        "translate",
        "tasks.translate",
        {"average": "average", "tokenizer": "tokenizer", "download": "download"},
    ),
    StageSpec("score", "tasks.score", {"translate": "translate", "download": "download"}),
    StageSpec(
        "register",
        "tasks.register",
        {"average": "average", "tokenizer": "tokenizer", "score": "score"},
        io_bound=True,
    ),
)

PARSING: tuple[StageSpec, ...] = (
    StageSpec("treebank", "tasks.treebank"),
    StageSpec("linearize", "tasks.linearize", {"treebank": "treebank"}),
    StageSpec("tokenizer", "tasks.tokenizer", {"clean": "linearize"}),
    StageSpec("shard", "tasks.shard", {"clean": "linearize", "tokenizer": "tokenizer"}),
    StageSpec("train", "tasks.train", {"shard": "shard", "tokenizer": "tokenizer"}),
    StageSpec("average", "tasks.average", {"train": "train"}),
    StageSpec(
        "translate",
        "tasks.translate",
        {"average": "average", "tokenizer": "tokenizer", "download": "linearize"},
    ),
    StageSpec("parse_score", "tasks.parse_score", {"translate": "translate", "linearize": "linearize"}),
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


def downstream(config: RunConfig, names: Iterable[str]) -> set[str]:
    """The given stages and every stage that (transitively) reads them."""
    result = set(names)
    for s in pipeline(config):
        if any(up in result for up in s.inputs.values()):
            result.add(s.name)
    return result


def run_one(config: RunConfig, name: str, *, force: bool = False) -> Path:
    """Run one stage by name (its inputs must exist)."""
    s = spec(config, name)
    module = importlib.import_module(s.module)
    return Path(module.run(config, inputs_of(config, s), force=force))


def stage_config(config: RunConfig, name: str) -> Any:
    """What a stage fingerprints besides its inputs: the module's ``stage_config`` hook."""
    module = importlib.import_module(spec(config, name).module)
    return module.stage_config(config)


def status(config: RunConfig) -> list[tuple[str, Status]]:
    """Each stage: up to date, stale or missing, and why (without running anything)."""
    result: list[tuple[str, Status]] = []
    fresh: dict[str, bool] = {}
    for s in pipeline(config):
        stale_inputs = [up for up in s.inputs.values() if not fresh.get(up, False)]
        if stale_inputs:
            folder = output_dir(config, s.name)
            state = "missing" if not folder.exists() else "stale"
            st = Status(state, f"waits for {', '.join(dict.fromkeys(stale_inputs))}")
        else:
            input_fps = {
                role: read_manifest(path)["fingerprint"]
                for role, path in inputs_of(config, s).items()
            }
            fp = stage_fingerprint(s.name, stage_config(config, s.name), input_fps)
            st = check(output_dir(config, s.name), fp)
        fresh[s.name] = st.up_to_date
        result.append((s.name, st))
    return result
