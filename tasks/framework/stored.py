"""Stage folders on an object store: what the runner does instead of renaming a local folder
when the work dir is ``s3://`` or ``gs://`` (``config.store.remote``).

A stage still builds into a local temporary folder (under ``config.root``, this node's folder
for the run) and the runner writes its manifest there; ``Store.publish`` then uploads it with the
manifest last, and the folder becomes this node's copy of the output, so the next stage reads
it without a download. An input is the store's folder, judged by its manifest and the sizes the
store lists, and read from this node's copy (``node_copy``: fetched once, sha256-checked).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from corpora.storage import StorageError, StoredFolder, node_copy
from tasks.framework.config import RunConfig
from tasks.framework.contract import (
    MANIFEST,
    StageError,
    StageResult,
    Status,
    accepted,
    judge,
    read_manifest,
)
from transformer_core.folders import (
    publish,
    remove_stale_temporaries,
    temporary_sibling,
    write_json_atomic,
)


def copies(config: RunConfig) -> Path:
    """This node's cache of the store's folders (``node_copy``'s root)."""
    return config.root / "copies"


def location(config: RunConfig, name: str) -> str:
    """Stage ``name``'s folder as a URI, as messages and manifests name it."""
    return f"{config.store.uri}/{name}"


def folder(config: RunConfig, name: str, fingerprint: str) -> StoredFolder:
    """Stage ``name``'s folder (its manifest's ``fingerprint``) as a Ray worker is handed it:
    each node copies it once, to the path this node's copy has."""
    return StoredFolder(config.store, name, str(copies(config)), fingerprint)


def local_copy(config: RunConfig, name: str) -> Path:
    """This node's copy of stage ``name``'s complete folder (fetched now if it has none)."""
    try:
        return node_copy(config.store, name, copies(config))
    except StorageError as exc:
        raise StageError(str(exc)) from None


def check(config: RunConfig, name: str, identity: Mapping[str, Any], *, full: bool = False,
          outdated: Callable[[Path], str | None] | None = None) -> Status:
    """``contract.freshness`` for the store's folder: its manifest against ``identity``, the
    files the store lists against their sizes (every sha256 read back with ``full``), then the
    stage's ``outdated`` rule on this node's copy."""
    store = config.store
    manifest = store.read_manifest(name)
    if manifest is None:
        if store.exists(name):
            return Status("stale", f"{location(config, name)} has no readable {MANIFEST}")
        return Status("missing", f"{location(config, name)} does not exist")
    status = judge(manifest, identity,
                   lambda: store.verify(name, manifest) if full else store.missing(name, manifest))
    if status.up_to_date and outdated is not None and (why := outdated(local_copy(config, name))):
        return Status("stale", why)
    return status


def input_fingerprint(config: RunConfig, name: str, role: str) -> str:
    """The fingerprint of the finished input folder ``name``; a clear error if it is missing or
    incomplete (``contract.input_fingerprint`` for the store)."""
    store = config.store
    manifest = store.read_manifest(name)
    if manifest is None:
        raise StageError(f"input {role!r} is missing: {location(config, name)} has no {MANIFEST} "
                         f"(run `tfm stage {name}` first)")
    problem = store.missing(name, manifest)
    if problem is not None:
        raise StageError(f"input {role!r} is damaged: {problem} "
                         f"(rebuild it: `tfm stage {name} --config <config> --force`)")
    return manifest["fingerprint"]


def staging(config: RunConfig, name: str) -> Path:
    """A fresh local folder to build stage ``name``'s output in (what a dead run left removed)."""
    out = config.root / "staging" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = temporary_sibling(out)
    tmp.mkdir()
    return tmp


def publish_stored(config: RunConfig, name: str, tmp: Path) -> Path:
    """Upload the finished ``tmp`` (manifest written) as stage ``name``'s folder, manifest last,
    then keep it as this node's copy; that copy's path."""
    config.store.publish(tmp, name)
    manifest = read_manifest(tmp)
    assert manifest is not None  # the runner wrote it
    out = copies(config) / manifest["fingerprint"] / name
    out.parent.mkdir(parents=True, exist_ok=True)
    publish(tmp, out)
    return out


def accept(config: RunConfig, name: str, current: Callable[[], Mapping[str, Any]]) -> StageResult:
    """``contract.accept`` for the store's folder: every file's sha256 read back, then the
    manifest replaced (one object: readers see the old one or the new one)."""
    started, store = time.time(), config.store
    manifest = store.read_manifest(name)
    if manifest is None:
        raise StageError(f"{location(config, name)} holds no finished output to accept (no {MANIFEST})")
    problem = store.verify(name, manifest)
    if problem is not None:
        raise StageError(f"{location(config, name)} cannot be accepted: {problem}; rerun the stage instead")
    identity = dict(current())
    status = judge(manifest, identity, lambda: None)
    if not status.up_to_date:
        store.write_manifest(name, accepted(manifest, identity, status.reason, started))
        status = Status("up to date", f"accepted: {status.reason}")
    return StageResult(name, local_copy(config, name), False, status.reason,
                       manifest.get("stats", {}), time.time() - started)


def manifest_copy(config: RunConfig, name: str, manifest: Mapping[str, Any]) -> Path:
    """A local folder holding stage ``name``'s manifest, for a skipped stage's result (what the
    runner logs): this node's copy if it has one, else the manifest alone (nothing downloaded)."""
    have = copies(config) / str(manifest.get("fingerprint")) / name
    if read_manifest(have) == manifest:
        return have
    out = config.root / "manifests" / name
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MANIFEST, manifest)
    return out
