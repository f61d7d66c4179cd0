"""What is wrong with a finished folder's files against its manifest."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.framework.manifest import MANIFEST
from tasks.framework.table_rows import TABLE_FILES, table_rows
from transformer_core.folders import sha256_file

SMALL_FILE = 1 << 20
"""Files up to this size are checked by sha256 whenever their folder is checked; larger ones by
size (and Parquet files by their footer) unless a full check is asked for."""


def damage(folder: Path, manifest: Mapping[str, Any], *, full: bool = False) -> str | None:
    """What is wrong with a finished folder's files against its manifest, or None: a missing
    file, another size, a Parquet or Arrow IPC file whose footer does not read or holds another
    row count, a sha256 that differs (files
    up to ``SMALL_FILE``; every file with ``full``)."""
    for rel, info in manifest.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != info["bytes"]:
            return f"{rel} has {size} bytes, manifest says {info['bytes']}"
        if path.suffix in TABLE_FILES:
            rows = table_rows(path)
            if rows is None:
                kind = TABLE_FILES[path.suffix]
                return f"{rel} is not a readable {kind} file (its footer does not read)"
            if rows != info.get("rows", rows):
                return f"{rel} holds {rows} rows, manifest says {info['rows']}"
        if (
            "sha256" in info
            and (full or size <= SMALL_FILE)
            and sha256_file(path) != info["sha256"]
        ):
            return f"{rel} differs from the sha256 in {MANIFEST}"
    return None
