"""Files from outside the pipeline (a local corpus, treebank files, a silver corpus) fingerprinted
by their bytes, so an edited file reruns what read it and a touched one does not.

A file's sha256 is kept in a cache keyed on its path, size and modification time, so ``tfm
status`` does not read a large corpus again while it is unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from tasks.framework.config import fingerprint
from transformer_core.folders import write_json_atomic


class HashCache:
    """sha256 of files by (path, size, mtime), kept in a JSON file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def sha256(self, file: Path) -> str:
        from transformer_core.folders import sha256_file

        stat = file.stat()
        key, when = str(file.resolve()), [stat.st_size, stat.st_mtime_ns]
        cached = self.entries.get(key)
        if cached is not None and cached[:2] == when:
            return cached[2]
        digest = sha256_file(file)
        self.entries[key] = [*when, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        """Write the cache if it learnt anything (a temporary file renamed: never half-written)."""
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, self.entries)
        self.changed = False


def default_cache() -> Path:
    """The machine's cache of file digests (one per user: a corpus that many runs read is
    hashed once)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-pipeline" / "sha256.json"


def file_digests(
    files: Iterable[Path], root: Path, cache_file: Path | None = None
) -> dict[str, str] | None:
    """``{path under root: sha256}`` of ``files``; None if one is missing (the stage that reads
    them says which)."""
    files = sorted(Path(f) for f in files)
    if not all(f.is_file() for f in files):
        return None
    cache = HashCache(cache_file or default_cache())
    digests = {
        (f.relative_to(root).as_posix() if f.is_relative_to(root) else str(f)): cache.sha256(f)
        for f in files
    }
    cache.save()
    return digests


def files_digest(files: Iterable[Path], root: Path, cache_file: Path | None = None) -> str | None:
    """One fingerprint of ``file_digests`` (for many files, such as a treebank's)."""
    digests = file_digests(files, root, cache_file)
    return None if digests is None else fingerprint(digests)
