"""The work dir on an object store (``s3://``, ``gs://``): ``StoreWorkDir``, the object store's
side of the work dir seam (``tasks.framework.workdir.WorkDir``).

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

from filesystem.location import Location
from filesystem.storage import StorageError, Store, StoredFolder, node_copy
from tasks.framework.freshness import accepted, judge
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.results import StageError, StageResult, Status
from transformer_core.folders import fresh_temporary, publish, write_json_atomic


class StoreWorkDir:
    """A work dir on an object store (``store``), with this node's copies of its folders under
    ``root`` (``config.root``: this node's folder for the run)."""

    def __init__(self, store: Store, root: Path):
        self.store, self.root = store, Path(root)

    @property
    def copies(self) -> Path:
        """This node's cache of the store's folders (``node_copy``'s root)."""
        return self.root / "copies"

    def check(self) -> None:
        self.store.check()  # a missing bucket, refused keys, a silent endpoint: one line

    def locate(self, name: str) -> str:
        return f"{self.store.uri}/{name}"

    def location(self, rel: str) -> Location:
        return self.store.location(rel)

    def node_path(self, rel: str) -> Path:
        return self.root / rel

    def manifest(self, name: str) -> dict[str, Any] | None:
        return self.store.read_manifest(name)

    def exists(self, name: str) -> bool:
        return self.store.exists(name)

    def verify(
        self,
        name: str,
        identity: Mapping[str, Any],
        *,
        full: bool = False,
        outdated: Callable[[Path], str | None] | None = None,
    ) -> Status:
        """``freshness.freshness`` for the store's folder: its manifest against ``identity``, the
        files the store lists against their sizes (every sha256 read back with ``full``), then
        the stage's ``outdated`` rule on this node's copy."""
        store = self.store
        manifest = store.read_manifest(name)
        if manifest is None:
            if store.exists(name):
                return Status("stale", f"{self.locate(name)} has no readable {MANIFEST}")
            return Status("missing", f"{self.locate(name)} does not exist")
        status = judge(
            manifest,
            identity,
            lambda: store.verify(name, manifest) if full else store.missing(name, manifest),
        )
        if status.up_to_date and outdated is not None and (why := outdated(self.local_copy(name))):
            return Status("stale", why)
        return status

    def input_fingerprints(
        self, inputs: Mapping[str, str], given: Mapping[str, Path] | None = None
    ) -> dict[str, str]:
        """The fingerprints of the finished input folders; a clear error for one that is
        missing or incomplete (``stage_fingerprint.input_fingerprint`` for the store)."""
        if given is not None:
            raise StageError(f"inputs given by hand need a local work dir, not {self.store.uri}")
        fps = {}
        for role, name in inputs.items():
            manifest = self.store.read_manifest(name)
            if manifest is None:
                raise StageError(
                    f"input {role!r} is missing: {self.locate(name)} has no {MANIFEST} "
                    f"(run `tfm stage {name}` first)"
                )
            problem = self.store.missing(name, manifest)
            if problem is not None:
                raise StageError(
                    f"input {role!r} is damaged: {problem} "
                    f"(rebuild it: `tfm stage {name} --config <config> --force`)"
                )
            fps[role] = manifest["fingerprint"]
        return fps

    def input_folders(
        self,
        inputs: Mapping[str, str],
        fps: Mapping[str, str],
        given: Mapping[str, Path] | None = None,
    ) -> tuple[dict[str, Path], dict[str, StoredFolder]]:
        """This node's copies (a copy already here for that fingerprint is used without asking
        the store), and the store's folders, each as a Ray worker is handed it: each node copies
        it once, to the path this node's copy has."""
        sources = {
            role: StoredFolder(self.store, name, str(self.copies), fps[role])
            for role, name in inputs.items()
        }
        return {role: folder.local() for role, folder in sources.items()}, sources

    def input_places(
        self, inputs: Mapping[str, str], folders: Mapping[str, Path]
    ) -> dict[str, str]:
        return {role: self.locate(name) for role, name in inputs.items()}

    def staging(self, name: str) -> Path:
        return fresh_temporary(self.root / "staging" / name)

    def publish(self, name: str, tmp: Path) -> Path:
        """Upload the finished ``tmp`` as folder ``name``, manifest last, then keep it as this
        node's copy; that copy's path."""
        self.store.publish(tmp, name)
        manifest = read_manifest(tmp)
        assert manifest is not None  # the runner wrote it
        out = self.copies / manifest["fingerprint"] / name
        out.parent.mkdir(parents=True, exist_ok=True)
        publish(tmp, out)
        return out

    def skipped(self, name: str, manifest: Mapping[str, Any]) -> Path:
        """A local folder holding the manifest: this node's copy if it has one, else the
        manifest alone (nothing downloaded)."""
        have = self.copies / str(manifest.get("fingerprint")) / name
        if read_manifest(have) == manifest:
            return have
        out = self.root / "manifests" / name
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / MANIFEST, manifest)
        return out

    def accept(
        self, stage: str, name: str, current: Callable[[], Mapping[str, Any]]
    ) -> StageResult:
        """Every file's sha256 read back, then the manifest replaced (one object: readers see
        the old one or the new one)."""
        started, store = time.time(), self.store
        manifest = store.read_manifest(name)
        if manifest is None:
            raise StageError(
                f"{self.locate(name)} holds no finished output to accept (no {MANIFEST})"
            )
        problem = store.verify(name, manifest)
        if problem is not None:
            raise StageError(
                f"{self.locate(name)} cannot be accepted: {problem}; rerun the stage instead"
            )
        identity = dict(current())
        status = judge(manifest, identity, lambda: None)
        if not status.up_to_date:
            store.write_manifest(name, accepted(manifest, identity, status.reason, started))
            status = Status("up to date", f"accepted: {status.reason}")
        return StageResult(
            stage,
            self.local_copy(name),
            False,
            status.reason,
            manifest.get("stats", {}),
            time.time() - started,
        )

    def local_copy(self, name: str) -> Path:
        """This node's copy of folder ``name`` (fetched now if it has none)."""
        try:
            return node_copy(self.store, name, self.copies)
        except StorageError as exc:
            raise StageError(str(exc)) from None
