"""A place in a pyarrow filesystem, typed: the filesystem, the path in it, and the name people
read, as one value (Ray Train's storage, its run folder, the best weights in it). A local folder
and an object store's prefix are the same type; which one is the filesystem's business."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Location:
    """``path`` in ``filesystem``; ``name`` says where, as messages and MLflow params show it."""

    filesystem: Any  # a pyarrow FileSystem: pyarrow ships no types
    path: str
    name: str

    def child(self, rel: str) -> Location:
        """Location ``rel`` (a '/'-separated path) under this one."""
        return Location(
            self.filesystem, f"{self.path.rstrip('/')}/{rel}", f"{self.name.rstrip('/')}/{rel}"
        )


def locate(where: str) -> Location:
    """The location a local path (resolved from the CWD) or a URI (``s3://``, ``gs://``) names."""
    import pyarrow.fs as pafs

    if "://" in where:
        filesystem, path = pafs.FileSystem.from_uri(where)
        return Location(filesystem, path, where)
    path = str(Path(where).resolve())
    return Location(pafs.LocalFileSystem(), path, path)
