"""Registry downloads pinned once read: a file is fetched into the download cache (verified
against the registry's checksums and the lock file's pin), and pinned in the lock file only
after its reader accepted it; a file that does not read is dropped from the cache, so a rerun
starts afresh (``corpora.assemble`` reads them)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from corpora import CorpusError
from corpora.fetch import Expected, Seen, download, mirror_url
from corpora.lockfile import LockFile
from corpora.sources import Archive
from filesystem.redact import redact_uri

__all__ = ["Fetched", "fetch", "pinned_once_read"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fetched:
    """A registry file in the download cache."""

    archive: Archive
    path: Path
    seen: Seen
    pinned: Expected | None
    """What the lock file had pinned for it before this run (None: nothing)."""


def fetch(
    archive: Archive, path: Path, *, mirror: str | None, lock: LockFile, max_retries: int
) -> Fetched:
    """``archive`` at ``path``, downloaded (from ``mirror`` if set) unless a copy that verifies
    against the registry's checksums and the lock file's pin is already there."""
    url = mirror_url(archive.url, mirror, bases=(archive.base,))
    pinned = lock.expected(archive.url)
    registry = Expected(archive.bytes, archive.sha256, archive.md5, origin="the source registry")
    expected = [e for e in (registry, pinned) if e is not None]
    log.info("download: %s -> %s", redact_uri(url), path)
    seen = download(url, path, expected, max_retries=max_retries)
    return Fetched(archive, path, seen, pinned)


@contextmanager
def pinned_once_read(files: Sequence[Fetched], lock: LockFile) -> Iterator[None]:
    """Pin ``files`` in the lock file once the block has read them without a CorpusError.

    Pinned only then, so a bad file never becomes the pin. A cached file that failed to read
    would be reused by every rerun: on an error all of ``files`` are dropped from the cache,
    and the error says so, keeping its class (unsafe archive, missing member, ...) for callers.
    """
    try:
        yield
    except CorpusError as exc:
        for f in files:
            f.path.unlink(missing_ok=True)
        raise type(exc)(f"{exc}; {_after_bad_download(files, lock)}") from None
    for f in files:
        lock.pin(f.archive.url, f.seen)


def _after_bad_download(files: Sequence[Fetched], lock: LockFile) -> str:
    """What a user can do about downloaded files that did not read (now removed from the cache)."""
    removed = " and ".join(str(f.path) for f in files)
    hints = [lock.unpin_hint(f.archive.url) for f in files if f.pinned is not None]
    if not hints:
        them = "it" if len(files) == 1 else "them"
        return f"removed the cached {removed} and pinned nothing, so a rerun downloads {them} again"
    return f"removed the cached {removed}. {' '.join(hints)}"
