"""A place in a filesystem, typed: the filesystem, the path in it, and the name people read, as
one value (Ray Train's storage, its run folder, the best weights in it, a shard split), opened
one way (``open_location``) from a local path or a URI.

The filesystem is a small protocol (``FileSystem``, as fairseq2's) with two implementations:
this node's own disk (``LocalFileSystem``) and a filesystem a URI names (``UriFileSystem``: an
object store through pyarrow's own S3 and GCS clients, any other scheme fsspec knows, such as
``memory://``, through fsspec). A reader asks the location, never the path's scheme: its pyarrow
filesystem (``arrow``), its files, and whether it is a file of this node's (``local``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

ARROW_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
"""URI schemes pyarrow reaches with its own clients; any other goes through fsspec."""


class FileSystem(Protocol):
    """What a reader needs of the filesystem a location is in."""

    @property
    def arrow(self) -> Any:  # a pyarrow FileSystem: pyarrow ships no types
        """The filesystem as pyarrow takes it (Parquet readers, Ray Train's storage)."""
        ...

    def local_path(self, path: str) -> Path | None:
        """``path`` as a file of this node's own disk (what a memory map opens), or None."""
        ...


@dataclass(frozen=True)
class LocalFileSystem:
    """This node's own disk (or a shared file system mounted on it)."""

    @property
    def arrow(self) -> Any:  # pyarrow ships no types
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem()

    def local_path(self, path: str) -> Path | None:
        return Path(path)


@dataclass(frozen=True)
class UriFileSystem:
    """A filesystem a URI names, reached through ``arrow`` (nothing of it is this node's file)."""

    arrow: Any  # a pyarrow FileSystem: pyarrow ships no types

    @classmethod
    def fsspec(cls, filesystem: Any) -> UriFileSystem:  # Any: fsspec ships no types
        """An fsspec filesystem, as pyarrow reads it."""
        import pyarrow.fs as pafs

        return cls(pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)))

    def local_path(self, path: str) -> Path | None:
        return None


@dataclass(frozen=True)
class Location:
    """``path`` in ``filesystem``; ``name`` says where, as messages and MLflow params show it."""

    filesystem: FileSystem
    path: str
    name: str

    @property
    def arrow(self) -> Any:  # a pyarrow FileSystem: pyarrow ships no types
        """The location's filesystem as pyarrow takes it."""
        return self.filesystem.arrow

    def child(self, rel: str) -> Location:
        """Location ``rel`` (a '/'-separated path) under this one."""
        return Location(
            self.filesystem, f"{self.path.rstrip('/')}/{rel}", f"{self.name.rstrip('/')}/{rel}"
        )

    def files(self) -> list[str]:
        """The paths of the files directly in this folder, sorted; [] if it does not exist."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path, allow_not_found=True)
        found = self.arrow.get_file_info(selector)
        return sorted(info.path for info in found if info.type == pafs.FileType.File)

    def local(self) -> Path | None:
        """This location as a path of this node's own disk, or None (an object store's)."""
        return self.filesystem.local_path(self.path)


def open_location(where: str | Path) -> Location:
    """The location a local path (resolved from the CWD) or a URI names: ``file://`` is this
    node's disk, ``s3://`` and ``gs://`` pyarrow's clients, any other scheme fsspec's."""
    text = str(where)
    if "://" not in text:
        path = str(Path(text).resolve())
        return Location(LocalFileSystem(), path, path)
    parts = urlsplit(text)
    if parts.scheme == "file":
        return Location(LocalFileSystem(), str(Path(parts.path).resolve()), text)
    if parts.scheme in ARROW_SCHEMES:
        import pyarrow.fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(text)
        return Location(UriFileSystem(filesystem), path, text)
    from fsspec.core import url_to_fs

    filesystem, path = url_to_fs(text)
    return Location(UriFileSystem.fsspec(filesystem), path, text)
