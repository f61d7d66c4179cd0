"""The work dir seam: where a run's stage folders live, as one interface (``WorkDir``) with two
implementations, a local folder (``LocalWorkDir``, here) and an object store
(``tasks.framework.workdir_store.StoreWorkDir``). The runner goes through it alone, so it has one
path: it judges a folder (``verify``), reads its inputs' fingerprints and folders, builds into
``staging``, writes the manifest there and ``publish``es; ``locate`` names a folder for people
and manifests, ``location`` as a filesystem and a path. The run's own files (its tracking
journals) go through tracking's seam (``tracking.copies``), not this one; what the config's
``workdir`` names (its kind, this node's folder) is read in ``workdir_place``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from filesystem.location import Location, open_location
from filesystem.storage import StoredFolder, folder_at, is_remote
from tasks.framework.config import RunConfig
from tasks.framework.freshness import accept, freshness
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError, StageResult, Status
from tasks.framework.stage_fingerprint import input_fingerprints
from transformer_core.folders import fresh_temporary, publish

Outdated = Callable[[Path], "str | None"]
"""A stage's rule that overrules an up-to-date folder (register: its registry version is gone)."""


class WorkDir(Protocol):
    """A run's work dir: its stage folders by name (a stage's name, or any folder's in it)."""

    def check(self) -> None:
        """Fail in one line unless it can be used now (an object store's bucket and keys)."""
        ...

    def locate(self, name: str) -> str:
        """Folder ``name``, as people and manifests name it."""
        ...

    def location(self, rel: str) -> Location:
        """``rel`` in the work dir as a filesystem and a path (Ray Train's storage)."""
        ...

    def node_path(self, rel: str) -> Path:
        """``rel`` in this node's folder for the run (a local work dir itself; for an object
        store's, its folder under ``storage.cache_dir``): what stays on this node, never
        published (the download cache and its lock file, CTranslate2 exports, a stage's resume
        folder)."""
        ...

    def manifest(self, name: str) -> dict[str, Any] | None:
        """Folder ``name``'s manifest, or None (none, or unreadable)."""
        ...

    def exists(self, name: str) -> bool: ...

    def verify(
        self,
        name: str,
        identity: Mapping[str, Any],
        *,
        full: bool = False,
        outdated: Outdated | None = None,
    ) -> Status:
        """Whether folder ``name`` is up to date for ``identity`` (``freshness.judge``: its
        manifest, its files' sizes, every file's sha256 with ``full``), then ``outdated``."""
        ...

    def input_fingerprints(
        self, inputs: Mapping[str, str], given: Mapping[str, Path] | None = None
    ) -> dict[str, str]:
        """Role -> fingerprint of the finished input folders (``inputs``: role -> folder name;
        ``given``: folders by hand, where a work dir allows it); a clear error for one that is
        missing or damaged."""
        ...

    def input_folders(
        self,
        inputs: Mapping[str, str],
        fps: Mapping[str, str],
        given: Mapping[str, Path] | None = None,
    ) -> tuple[dict[str, Path], dict[str, StoredFolder]]:
        """The local folders a build reads by role, and the same folders as a Ray worker on any
        node is handed them (``StoredFolder.local``: an object store's folder copied once per
        node; a local work dir's read where it is)."""
        ...

    def input_places(
        self, inputs: Mapping[str, str], folders: Mapping[str, Path]
    ) -> dict[str, str]:
        """How the manifest names each input (a resolved path, or a URI)."""
        ...

    def staging(self, name: str) -> Path:
        """A fresh local folder to build folder ``name`` in (what a dead run left removed)."""
        ...

    def publish(self, name: str, tmp: Path) -> Path:
        """The finished ``tmp`` (manifest written last) as folder ``name``, whole or not at all;
        the local folder the result names."""
        ...

    def skipped(self, name: str, manifest: Mapping[str, Any]) -> Path:
        """The local folder a skipped stage's result names (its manifest at least)."""
        ...

    def accept(
        self, stage: str, name: str, current: Callable[[], Mapping[str, Any]]
    ) -> StageResult:
        """``freshness.accept`` for folder ``name``: kept as up to date for ``current()``."""
        ...


def open_workdir(config: RunConfig) -> WorkDir:
    """The config's work dir: an object store's (``s3://``, ``gs://``) or a local folder."""
    if is_remote(config.workdir):
        from tasks.framework.workdir_store import StoreWorkDir

        return StoreWorkDir(config.store, config.root)
    return LocalWorkDir(config.root)


class LocalWorkDir:
    """A work dir on a local (or shared) file system: folder ``name`` is ``root/name``, built
    in a temporary sibling and renamed into place."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def check(self) -> None:
        pass

    def locate(self, name: str) -> str:
        return str(self.root / name)

    def location(self, rel: str) -> Location:
        return open_location(self.root / rel)

    def node_path(self, rel: str) -> Path:
        return self.root / rel

    def manifest(self, name: str) -> dict[str, Any] | None:
        return read_manifest(self.root / name)

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def verify(
        self,
        name: str,
        identity: Mapping[str, Any],
        *,
        full: bool = False,
        outdated: Outdated | None = None,
    ) -> Status:
        return freshness(self.root / name, identity, outdated=outdated, full=full)

    def _folders(
        self, inputs: Mapping[str, str], given: Mapping[str, Path] | None
    ) -> dict[str, Path]:
        if given is None:
            return {role: self.root / up for role, up in inputs.items()}
        for role in inputs:
            if role not in given:
                raise StageError(f"the input {role!r} is not given")
        return {role: Path(given[role]) for role in inputs}

    def input_fingerprints(
        self, inputs: Mapping[str, str], given: Mapping[str, Path] | None = None
    ) -> dict[str, str]:
        return input_fingerprints(self._folders(inputs, given))

    def input_folders(
        self,
        inputs: Mapping[str, str],
        fps: Mapping[str, str],
        given: Mapping[str, Path] | None = None,
    ) -> tuple[dict[str, Path], dict[str, StoredFolder]]:
        folders = self._folders(inputs, given)
        return folders, {role: folder_at(path) for role, path in folders.items()}

    def input_places(
        self, inputs: Mapping[str, str], folders: Mapping[str, Path]
    ) -> dict[str, str]:
        return {role: str(Path(folders[role]).resolve()) for role in inputs}

    def staging(self, name: str) -> Path:
        return fresh_temporary(self.root / name)

    def publish(self, name: str, tmp: Path) -> Path:
        publish(tmp, self.root / name)
        return self.root / name

    def skipped(self, name: str, manifest: Mapping[str, Any]) -> Path:
        return self.root / name

    def accept(
        self, stage: str, name: str, current: Callable[[], Mapping[str, Any]]
    ) -> StageResult:
        return accept(stage, self.root / name, current)
