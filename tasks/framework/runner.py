"""The one runner: every stage runs here, whoever asks (``tfm run``'s flow, ``tfm stage``, the
tests), and ``tfm status`` and ``tfm stage --accept`` judge a folder by the same identity.

``run_stage(config, name)`` looks the stage up in the graph, checks its inputs, computes its
identity (``identity``: the stage's ``stage_config``, its inputs' fingerprints, its code), skips
it when its folder is up to date (``standing``), else calls its module's ``build`` on a
temporary folder, writes the manifest, publishes the folder and logs the result to MLflow.
``build_folder`` is that core without the graph, for folders made by hand (tests, benchmarks).
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from corpora.redact import redacted
from tasks.framework import stored, tracking
from tasks.framework.config import RunConfig, fingerprint, to_dict
from tasks.framework.contract import (
    MANIFEST,
    BuildContext,
    StageError,
    StageResult,
    Status,
    accept,
    code_version,
    describe_files,
    freshness,
    input_fingerprints,
    read_manifest,
    stage_identity,
)
from tasks.framework.graph import StageSpec, inputs_of, output_dir, pipeline, spec
from transformer_core.folders import (
    publish,
    remove_stale_temporaries,
    temporary_sibling,
    write_json_atomic,
)

log = logging.getLogger(__name__)


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
) -> tuple[dict[str, Any], Status]:
    """The stage's ``identity`` and whether its folder is up to date for it
    (``contract.freshness``, with the stage's ``outdated`` rule unless ``outdated`` is false):
    what ``run_stage`` skips on and ``tfm status`` shows, one decision."""
    ident = identity(config, stage, input_fps)
    rule = (lambda folder: stage.outdated(config, folder)) if outdated else None
    if config.store.remote:
        return ident, stored.check(config, stage.name, ident, outdated=rule, full=full)
    return ident, freshness(output_dir(config, stage.name), ident, outdated=rule, full=full)


def place(config: RunConfig, name: str) -> str:
    """Where stage ``name``'s output lives, as a person reads it: its folder, or its URI."""
    return stored.location(config, name) if config.store.remote else str(output_dir(config, name))


def stage_inputs(
    config: RunConfig, stage: StageSpec, given: Mapping[str, Path] | None = None
) -> dict[str, Path]:
    """Input role -> folder: the graph's upstream folders, or ``given`` (its roles the stage
    reads, others dropped); a clear error for a role ``given`` lacks."""
    if given is None:
        return inputs_of(config, stage)
    for role in stage.inputs:
        if role not in given:
            raise StageError(f"the {stage.name} stage needs the input {role!r}")
    return {role: Path(given[role]) for role in stage.inputs}


def run_stage(
    config: RunConfig,
    name: str,
    inputs: Mapping[str, Path] | None = None,
    *,
    force: bool | str = False,
    **options: object,
) -> StageResult:
    """Run stage ``name`` of the config's pipeline into ``<workdir>/<name>`` unless it is up to
    date, and log its result into the active MLflow run (if any).

    ``inputs``: role -> folder, the graph's upstream folders when not given. ``force`` runs it
    anyway; a string says why (``upstream shard ran``). ``options`` go to the stage's ``build``
    unfingerprinted (train's ``callbacks``: they must not change what it makes). An error
    leaving it carries the note ``stage <name> failed`` (the command line prints it).
    """
    stage = spec(config, name)
    started = time.time()
    try:
        if config.store.remote:
            result = _run_stored(config, stage, inputs, force, options, started)
            if "mlflow" in sys.modules:
                tracking.log_stage_result(result)
            return result
        folder_inputs = stage_inputs(config, stage, inputs)
        input_fps = input_fingerprints(folder_inputs)
        ident, st = standing(config, stage, input_fps, outdated=not force)

        def build(tmp: Path) -> Mapping[str, Any] | None:
            return stage.build(BuildContext(config, folder_inputs, input_fps, tmp), **options)

        result = _run_unless_fresh(name, output_dir(config, name), ident, st, folder_inputs,
                                   input_fps, build, started, force=force)
    except Exception as exc:
        exc.add_note(f"stage {name} failed")
        raise
    # No MLflow run can be active in a process that never imported MLflow: its import (seconds)
    # is spared to whoever runs stages without tracking (the tests, the benchmarks).
    if "mlflow" in sys.modules:
        tracking.log_stage_result(result)
    return result


def accept_stage(config: RunConfig, name: str) -> StageResult:
    """Keep stage ``name``'s output for the current config, inputs and code without running it
    (``contract.accept``: recorded in its manifest)."""
    stage = spec(config, name)
    if config.store.remote:
        return stored.accept(config, name, lambda: identity(config, stage, _stored_fps(config, stage)))
    return accept(name, output_dir(config, name),
                  lambda: identity(config, stage, input_fingerprints(inputs_of(config, stage))))


def status(config: RunConfig, *, full: bool = False) -> list[tuple[str, Status]]:
    """Each stage: up to date, stale or missing, and why (without running anything); ``full``
    checks every file's sha256, not only the small files'."""
    result: list[tuple[str, Status]] = []
    fresh: dict[str, bool] = {}
    remote = config.store.remote
    for stage in pipeline(config):
        folder = output_dir(config, stage.name)
        stale_inputs = [up for up in stage.inputs.values() if not fresh.get(up, False)]
        if stale_inputs:
            there = config.store.exists(stage.name) if remote else folder.exists()
            state = "stale" if there else "missing"
            st = Status(state, f"waits for {', '.join(dict.fromkeys(stale_inputs))}")
        else:
            # The inputs were just found up to date (damage included): their manifests'
            # fingerprints are what input_fingerprints returns, without checking them again.
            input_fps: dict[str, str] = {}
            for role, path in inputs_of(config, stage).items():
                manifest = config.store.read_manifest(path.name) if remote else read_manifest(path)
                assert manifest is not None  # found up to date just now
                input_fps[role] = manifest["fingerprint"]
            _, st = standing(config, stage, input_fps, full=full)
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
    input_fps = input_fingerprints(inputs)
    ident = stage_identity(stage, config, input_fps)
    st = freshness(Path(out_dir), ident, outdated=None if force else outdated)
    return _run_unless_fresh(stage, Path(out_dir), ident, st, inputs, input_fps, build, started,
                             force=force, hash_files=hash_files)


def _run_unless_fresh(
    stage: str,
    out_dir: Path,
    ident: Mapping[str, Any],
    status: Status,
    inputs: Mapping[str, Path],
    input_fps: Mapping[str, str],
    build: Callable[[Path], Mapping[str, Any] | None],
    started: float,
    *,
    force: bool | str = False,
    hash_files: bool = True,
) -> StageResult:
    """Skip an up-to-date folder (unless forced); else build into a temporary sibling, write the
    manifest last and rename the folder into place, so a crash never leaves one that looks done."""
    reason = (force if isinstance(force, str) else "forced") if force else status.reason
    if status.up_to_date and not force:
        log.info("stage %s: up to date, skipped (%s)", stage, out_dir)
        stats = (read_manifest(out_dir) or {}).get("stats", {})
        return StageResult(stage, out_dir, False, status.reason, stats, time.time() - started)
    log.info("stage %s: running (%s)", stage, reason)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    tmp = temporary_sibling(out_dir)
    tmp.mkdir()
    try:
        places = {n: str(Path(p).resolve()) for n, p in inputs.items()}
        stats = _write_manifest(tmp, stage, ident, places, input_fps, started, build(tmp),
                                hash_files=hash_files)
        publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("stage %s: done in %.1fs -> %s", stage, time.time() - started, out_dir)
    return StageResult(stage, out_dir, True, reason, stats, time.time() - started)


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


def _stored_fps(config: RunConfig, stage: StageSpec) -> dict[str, str]:
    """The fingerprints of the stage's input folders on the object store (checked complete)."""
    return {role: stored.input_fingerprint(config, up, role) for role, up in stage.inputs.items()}


def _run_stored(
    config: RunConfig,
    stage: StageSpec,
    given: Mapping[str, Path] | None,
    force: bool | str,
    options: Mapping[str, object],
    started: float,
) -> StageResult:
    """``run_stage`` with the work dir on an object store (``tasks.framework.stored``): the
    inputs judged by their manifests there and read from this node's copies, the output built
    locally, uploaded manifest last, and kept as this node's copy."""
    name = stage.name
    if given is not None:
        raise StageError(f"stage {name}: inputs given by hand need a local work dir, not {config.store.uri}")
    config.store.check()  # a missing bucket, refused keys, a silent endpoint: one line, nothing written
    input_fps = _stored_fps(config, stage)
    ident, st = standing(config, stage, input_fps, outdated=not force)
    reason = (force if isinstance(force, str) else "forced") if force else st.reason
    if st.up_to_date and not force:
        log.info("stage %s: up to date, skipped (%s)", name, stored.location(config, name))
        manifest = config.store.read_manifest(name) or {}
        return StageResult(name, stored.manifest_copy(config, name, manifest), False, st.reason,
                           manifest.get("stats", {}), time.time() - started)
    log.info("stage %s: running (%s)", name, reason)
    tmp = stored.staging(config, name)
    try:
        sources = {role: stored.folder(config, up, input_fps[role]) for role, up in stage.inputs.items()}
        # This node's copies: a copy already here for that fingerprint is used without asking the store.
        inputs = {role: folder.local() for role, folder in sources.items()}
        stats = stage.build(BuildContext(config, inputs, input_fps, tmp, sources), **options)
        places = {role: stored.location(config, up) for role, up in stage.inputs.items()}
        stats = _write_manifest(tmp, name, ident, places, input_fps, started, stats)
        out = stored.publish_stored(config, name, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("stage %s: done in %.1fs -> %s", name, time.time() - started, stored.location(config, name))
    return StageResult(name, out, True, reason, stats, time.time() - started)
