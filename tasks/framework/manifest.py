"""A stage folder's ``manifest.json``: reading it, and the files it lists (size, sha256, rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.framework.table_rows import TABLE_FILES, table_rows
from transformer_core.folders import sha256_file

MANIFEST = "manifest.json"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None if it has none (or an unreadable one)."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def describe_files(folder: Path, hash_files: bool = True) -> dict[str, dict[str, Any]]:
    """Size, sha256 and, for Parquet and Arrow IPC files, the row count of every file under
    ``folder`` except the manifest, by relative path."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            info: dict[str, Any] = {"bytes": path.stat().st_size}
            if hash_files:
                info["sha256"] = sha256_file(path)
            if path.suffix in TABLE_FILES:
                info["rows"] = table_rows(path)
            files[path.relative_to(folder).as_posix()] = info
    return files
