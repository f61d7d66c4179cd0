"""A run's own files kept in its object store beside the stage folders: folders that only grow
or never change (tracking journals), copied up as they are now (``upload``) and fetched by
another machine (``download_missing``). Not stage folders: no manifest, nothing judged."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from filesystem.storage import Store
from transformer_core.folders import publish, temporary_sibling

SMALL_FILE = 4096
"""``upload`` copies a file up to this size every time (a journal's state changes in place);
a larger one the store holds at the same size is left as it is (it only grows)."""


def upload(store: Store, local: Path, rel: str) -> None:
    """Copy the local folder ``local`` to ``rel`` of ``store``, as it is now."""
    with store.errors("write"):
        target = store.path(rel)
        selector = pafs.FileSelector(target, recursive=True, allow_not_found=True)
        there = {
            info.path[len(target) + 1 :]: info.size
            for info in store.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File
        }
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            name = path.relative_to(local).as_posix()
            size = path.stat().st_size
            if size > SMALL_FILE and there.get(name) == size:
                continue
            pafs.copy_files(
                str(path),
                f"{target}/{name}",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=store.filesystem,
            )


def download_missing(store: Store, rel: str, local: Path) -> list[str]:
    """Copy each folder under ``rel`` of ``store`` that ``local`` lacks into it; the names of
    the folders copied."""
    with store.errors("read"):
        selector = pafs.FileSelector(store.path(rel), allow_not_found=True)
        folders = [
            info.base_name
            for info in store.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.Directory
        ]
        fetched = []
        for name in sorted(folders):
            if (Path(local) / name).exists():
                continue
            tmp = temporary_sibling(Path(local) / name)
            source = store.path(f"{rel}/{name}")
            files = store.filesystem.get_file_info(pafs.FileSelector(source, recursive=True))
            for info in files:  # file by file: a local folder must exist before a file in it
                if info.type != pafs.FileType.File:
                    continue
                target = tmp / info.path[len(source) + 1 :]
                target.parent.mkdir(parents=True, exist_ok=True)
                pafs.copy_files(
                    info.path,
                    str(target),
                    source_filesystem=store.filesystem,
                    destination_filesystem=pafs.LocalFileSystem(),
                )
            publish(tmp, Path(local) / name)
            fetched.append(name)
        return fetched
