"""The lock file: the sha256 and size of a URL's first download that its reader accepted, for
files nobody publishes a checksum for; later downloads must match."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from corpora import CorpusError
from corpora.fetch import Expected, Seen
from transformer_core.folders import write_json_atomic

log = logging.getLogger(__name__)


class LockFile:
    """A JSON file pinning ``url -> {bytes, sha256}`` as first accepted; later downloads must match.

    Callers pin a file only once it has been read successfully, so a bad file is never pinned.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _entries(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise CorpusError(f"lock file {self.path} is not valid JSON: {exc}") from None
        return dict(data.get("files", {}))

    def expected(self, url: str) -> Expected | None:
        """What ``url`` was pinned to, or None if it never was."""
        entry = self._entries().get(url)
        if entry is None:
            return None
        return Expected(
            bytes=entry.get("bytes"),
            sha256=entry.get("sha256"),
            origin=f"the lock file {self.path}",
            remedy=f"Nothing was kept. {self.unpin_hint(url)}",
        )

    def unpin_hint(self, url: str) -> str:
        """How to drop ``url``'s pin, for errors about a pinned file that turned out bad."""
        return (
            f"If the pinned file is bad, or changed upstream on purpose, remove the entry {url!r} "
            f"from {self.path} and rerun."
        )

    def pin(self, url: str, seen: Seen) -> None:
        """Record ``url``'s size and sha256 unless already pinned."""
        entries = self._entries()
        if url in entries:
            return
        entries[url] = {"bytes": seen.bytes, "sha256": seen.sha256}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"version": 1, "files": entries})
        log.info("pinned %s (sha256 %s) in %s", url, seen.sha256[:12], self.path)
