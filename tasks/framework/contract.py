"""The stage contract: what a stage module is given, raises and may read of its inputs.

A stage module has ``stage_config(config) -> dict`` (what it fingerprints besides its inputs)
and ``build(ctx: BuildContext) -> stats`` (writes its output into ``ctx.tmp``); the one runner
(``tasks.framework.runner``) does the rest. It writes into a temporary sibling folder;
``manifest.json`` is written last and the folder is then renamed into place, so a crash never
leaves a folder that looks complete. A stage whose folder holds a manifest with the same
fingerprint, and whose files are all there with the recorded sizes, is up to date and is
skipped (``freshness``). The runner logs each ``StageResult`` to MLflow once
(``tasks.framework.mlflow_runs.log_stage_result``); only train (its workers' curves) and
register (the model) log on their own, through ``tasks.framework.mlflow_runs`` too. A stage
raises ``tasks.framework.results.StageError`` for a failure it can explain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filesystem.storage import StoredFolder
from tasks.framework.config import RunConfig
from tasks.framework.workdir import WorkDir


@dataclass(frozen=True)
class BuildContext:
    """What a stage's ``build`` is given: the run config, its input folders by role, their
    fingerprints (checked by the runner: missing or damaged inputs never reach a build), and
    the temporary folder it writes its output into."""

    config: RunConfig
    inputs: Mapping[str, Path]
    input_fps: Mapping[str, str]
    tmp: Path
    workdir: WorkDir
    """The run's work dir, opened once per command: where Ray Train keeps its checkpoints
    (``WorkDir.location``), on whichever kind of store it is."""
    stored: Mapping[str, StoredFolder] = field(default_factory=dict)
    """Input role -> its folder as a Ray worker on any node is handed it (``StoredFolder.local``:
    an object store's folder copied once per node, a local work dir's read where it is;
    ``inputs`` are this node's)."""
