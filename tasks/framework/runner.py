"""The one runner: every stage runs here, whoever asks (``tfm run``'s flow, ``tfm stage``, the
tests), and ``tfm status`` and ``tfm stage --accept`` judge a folder by the same identity.

``run_stage(config, name)`` looks the stage up in the graph, checks its inputs, computes its
identity (``identity``: the stage's ``stage_config``, its inputs' fingerprints, its code), skips
it when its folder is up to date (``standing``), else calls its module's ``build`` on a
temporary folder, writes the manifest, publishes the folder and logs the result to MLflow.
``build_folder`` is that core without the graph, for folders made by hand (tests, benchmarks).
Where the folders live (a local folder, an object store) is the work dir's business
(``tasks.framework.workdir``): the runner has one path for both.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesystem.redact import redacted
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig, fingerprint, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.graph import StageSpec, pipeline, pipeline_name, spec
from tasks.framework.manifest import MANIFEST, describe_files
from tasks.framework.results import StageResult, Status
from tasks.framework.stage_fingerprint import code_version, stage_identity
from tasks.framework.workdir import LocalWorkDir, WorkDir, open_workdir
from tracking.run import Run
from transformer_core.folders import write_json_atomic

log = logging.getLogger(__name__)

Build = Callable[[Path, Mapping[str, Path], Mapping[str, Any]], "Mapping[str, Any] | None"]
"""What a run builds: ``(tmp, input folders, the store's input folders) -> stats``."""


def identity(config: RunConfig, stage: StageSpec, input_fps: Mapping[str, str]) -> dict[str, Any]:
    """What stage ``stage``'s fingerprint hashes for ``config`` and these input fingerprints: the
    one identity that running, accepting and ``tfm status`` compare a folder against."""
    return stage_identity(stage.name, stage.stage_config(config), input_fps)


def standing(
    config: RunConfig,
    stage: StageSpec,
    input_fps: Mapping[str, str],
    *,
    full: bool = False,
    outdated: bool = True,
    workdir: WorkDir | None = None,
) -> tuple[dict[str, Any], Status]:
    """The stage's ``identity`` and whether its folder is up to date for it (the work dir's
    ``verify``, with the stage's ``outdated`` rule unless ``outdated`` is false): what
    ``run_stage`` skips on and ``tfm status`` shows, one decision (``workdir``: the command's,
    else the config's opened now)."""
    ident = identity(config, stage, input_fps)
    rule = (lambda folder: stage.outdated(config, folder)) if outdated else None
    wd = workdir or open_workdir(config)
    return ident, wd.verify(stage.name, ident, outdated=rule, full=full)


def place(config: RunConfig, name: str, workdir: WorkDir | None = None) -> str:
    """Where stage ``name``'s output lives, as a person reads it: its folder, or its URI."""
    return (workdir or open_workdir(config)).locate(name)


def run_stage(
    config: RunConfig,
    name: str,
    inputs: Mapping[str, Path] | None = None,
    *,
    force: bool | str = False,
    workdir: WorkDir | None = None,
    **options: object,
) -> StageResult:
    """Run stage ``name`` of the config's pipeline into ``<workdir>/<name>`` unless it is up to
    date, and log its result into the current MLflow run (if any).

    ``inputs``: role -> folder, the graph's upstream folders when not given (a local work dir
    only). ``force`` runs it anyway; a string says why (``upstream shard ran``). ``options`` go
    to the stage's ``build`` unfingerprinted (train's ``callbacks``: they must not change what it
    makes). ``workdir``: the one the command opened (else the config's, opened now). An error
    leaving it carries the note ``stage <name> failed`` (the command line prints it).
    """
    stage = spec(config, name)
    started = time.time()
    try:
        config = stage.resolve(config)  # what it needs from outside, asked once: its build's too
        wd = workdir or open_workdir(config)
        wd.check()  # a missing bucket, refused keys, a silent endpoint: one line, nothing written
        input_fps = wd.input_fingerprints(stage.inputs, inputs)
        ident, st = standing(config, stage, input_fps, outdated=not force, workdir=wd)

        def build(tmp: Path, folders: Mapping[str, Path], sources: Mapping[str, Any]) -> Any:
            ctx = BuildContext(config, folders, input_fps, tmp, wd, dict(sources))
            return stage.build(ctx, **options)

        folder = Folder(name, name, ident, stage.inputs, inputs, input_fps, started)
        result = _run(wd, folder, st, build, force=force)
    except Exception as exc:
        exc.add_note(f"stage {name} failed")
        raise
    mlflow_runs.log_stage_result(result)
    return result


def accept_stage(config: RunConfig, name: str, workdir: WorkDir | None = None) -> StageResult:
    """Keep stage ``name``'s output for the current config, inputs and code without running it
    (``freshness.accept``: recorded in its manifest)."""
    stage, wd = spec(config, name), workdir or open_workdir(config)
    config = stage.resolve(config)
    return wd.accept(
        name, name, lambda: identity(config, stage, wd.input_fingerprints(stage.inputs))
    )


RunOne = Callable[[StageSpec, "bool | str", str], StageResult]
"""Runs one stage of a pipeline in its own MLflow run: ``(the stage, its force, the parent run's
journal key) -> result`` (a flow's Prefect task, or ``tracked_stage``)."""


def tracked_stage(
    config: RunConfig,
    name: str,
    *,
    force: bool | str = False,
    workdir: WorkDir | None = None,
    parent: str | None = None,
) -> StageResult:
    """``run_stage`` inside the stage's own MLflow run (under journal ``parent``'s run, else the
    current run, if any), which it logs its result into."""
    with mlflow_runs.stage_run(config, name, parent=parent):
        return run_stage(config, name, force=force, workdir=workdir)


def run_pipeline(
    config: RunConfig,
    run_one: RunOne,
    *,
    force: Collection[str] = (),
    only: Collection[str] | None = None,
    tags: Mapping[str, str] | None = None,
    opened: Callable[[Run], None] | None = None,
    follow_upstream: bool = True,
) -> tuple[list[StageResult], str]:
    """Run the config's pipeline stage by stage (those in ``only``, if given), each by
    ``run_one``, under one MLflow parent run (``tags``; ``opened`` is told it first); the results
    and how a person finds the parent run.

    ``force`` names stages to rerun. With ``follow_upstream`` a stage that actually runs reruns
    everything downstream of it too ("upstream <stage> ran"), as a trained model is never the
    same twice; without, each stage judges its own folder (the fairseq import: a conversion).
    """
    rerun: dict[str, str | bool] = {stage: True for stage in force}
    results: list[StageResult] = []
    name = pipeline_name(config)
    with mlflow_runs.pipeline_run(config, name, dict(tags or {})) as parent:
        if opened is not None:
            opened(parent)
        for stage in pipeline(config):
            if only is not None and stage.name not in only:
                continue
            ran = [
                up for up in stage.inputs.values() if any(r.ran and r.stage == up for r in results)
            ]
            if follow_upstream and ran and stage.name not in rerun:
                rerun[stage.name] = f"upstream {ran[0]} ran"
            results.append(run_one(stage, rerun.get(stage.name, False), parent.key))
        parent.set_tags({"stages.ran": ",".join(r.stage for r in results if r.ran)})
    return results, parent.label()


def status(
    config: RunConfig, *, full: bool = False, workdir: WorkDir | None = None
) -> list[tuple[str, Status]]:
    """Each stage: up to date, stale or missing, and why (without running anything); ``full``
    checks every file's sha256, not only the small files'."""
    result: list[tuple[str, Status]] = []
    fresh: dict[str, bool] = {}
    wd = workdir or open_workdir(config)
    for stage in pipeline(config):
        config, unresolved = stage.looked_up(config, wd)  # a teacher's version, if it can
        stale_inputs = [up for up in stage.inputs.values() if not fresh.get(up, False)]
        if stale_inputs:
            state = "stale" if wd.exists(stage.name) else "missing"
            st = Status(state, f"waits for {', '.join(dict.fromkeys(stale_inputs))}")
        else:
            # The inputs were just found up to date (damage included): their manifests'
            # fingerprints are what input_fingerprints returns, without checking them again.
            input_fps: dict[str, str] = {}
            for role, up in stage.inputs.items():
                manifest = wd.manifest(up)
                assert manifest is not None  # found up to date just now
                input_fps[role] = manifest["fingerprint"]
            _, st = standing(config, stage, input_fps, full=full, workdir=wd)
        if unresolved is not None:
            st = Status(st.state, f"{st.reason}; {unresolved}")
        fresh[stage.name] = st.up_to_date
        result.append((stage.name, st))
    return result


def build_folder(
    stage: str,
    out_dir: Path,
    config: Mapping[str, Any],
    inputs: Mapping[str, Path],
    build: Callable[[Path], Mapping[str, Any] | None],
    *,
    force: bool | str = False,
    hash_files: bool = True,
    outdated: Callable[[Path], str | None] | None = None,
) -> StageResult:
    """``run_stage``'s core for a folder outside the graph (made by hand in a test or a
    benchmark): ``build(tmp_dir) -> stats`` unless ``out_dir`` is up to date for ``stage``,
    ``config`` (the stage's own) and ``inputs``' fingerprints; published atomically.
    ``hash_files=False`` records sizes without sha256 (large generated inputs)."""
    started = time.time()
    out_dir = Path(out_dir)
    wd, roles = LocalWorkDir(out_dir.parent), {role: role for role in inputs}
    input_fps = wd.input_fingerprints(roles, inputs)
    ident = stage_identity(stage, config, input_fps)
    st = wd.verify(out_dir.name, ident, outdated=None if force else outdated)
    folder = Folder(stage, out_dir.name, ident, roles, inputs, input_fps, started)
    return _run(
        wd,
        folder,
        st,
        lambda tmp, _folders, _sources: build(tmp),
        force=force,
        hash_files=hash_files,
    )


@dataclass(frozen=True)
class Folder:
    """What ``_run`` makes: folder ``name`` of ``stage``, its ``identity`` and inputs (``inputs``:
    role -> the folder's name in the work dir; ``given``: folders by hand), timed from
    ``started``."""

    stage: str
    name: str
    identity: Mapping[str, Any]
    inputs: Mapping[str, str]
    given: Mapping[str, Path] | None
    input_fps: Mapping[str, str]
    started: float


def _run(
    wd: WorkDir,
    folder: Folder,
    status: Status,
    build: Build,
    *,
    force: bool | str = False,
    hash_files: bool = True,
) -> StageResult:
    """Skip ``folder`` when it is up to date (unless forced); else build into a staging folder,
    write the manifest last and publish it, so a crash never leaves one that looks done."""
    stage, name, started = folder.stage, folder.name, folder.started
    reason = (force if isinstance(force, str) else "forced") if force else status.reason
    if status.up_to_date and not force:
        log.info("stage %s: up to date, skipped (%s)", stage, wd.locate(name))
        manifest = wd.manifest(name) or {}
        return StageResult(
            stage,
            wd.skipped(name, manifest),
            False,
            status.reason,
            manifest.get("stats", {}),
            time.time() - started,
        )
    log.info("stage %s: running (%s)", stage, reason)
    tmp = wd.staging(name)
    try:
        # Read only when building: a skipped stage on an object store downloads nothing.
        folders, sources = wd.input_folders(folder.inputs, folder.input_fps, folder.given)
        stats = _write_manifest(
            tmp,
            stage,
            folder.identity,
            wd.input_places(folder.inputs, folders),
            folder.input_fps,
            started,
            build(tmp, folders, sources),
            hash_files=hash_files,
        )
        out = wd.publish(name, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("stage %s: done in %.1fs -> %s", stage, time.time() - started, wd.locate(name))
    return StageResult(stage, out, True, reason, stats, time.time() - started)


def _write_manifest(
    tmp: Path,
    stage: str,
    ident: Mapping[str, Any],
    places: Mapping[str, str],
    input_fps: Mapping[str, str],
    started: float,
    stats: Mapping[str, Any] | None,
    *,
    hash_files: bool = True,
) -> dict[str, Any]:
    """The finished ``tmp``'s manifest, written last: what made it (``places``: where each
    input was read) and every file's size and sha256; its stats (secrets masked)."""
    manifest: dict[str, Any] = {
        "stage": stage,
        "fingerprint": fingerprint(ident),
        "config": ident["config"],
        "inputs": {n: {"path": places[n], "fingerprint": input_fps[n]} for n in places},
        "code_version": code_version(),
        "code": ident["code"],
        "started": started,
        "seconds": round(time.time() - started, 3),
        "stats": redacted(to_dict(dict(stats or {}))),
        "files": describe_files(tmp, hash_files=hash_files),
    }
    write_json_atomic(tmp / MANIFEST, manifest)
    return manifest["stats"]
