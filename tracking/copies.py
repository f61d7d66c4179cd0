"""Where a node's journals are copied so that another machine finds them: the work dir's store
(``JournalCopies``). On an object store the journals live on this node's disk and are uploaded
while the server does not answer, and fetched back by ``tfm tracking replay`` on another node;
a local work dir's store is the folder that holds them already, so there is nothing to copy."""

from __future__ import annotations

from pathlib import Path

from filesystem.folder_sync import download_missing, upload
from filesystem.storage import Store
from tracking.journal import JOURNALS, Journal


class JournalCopies:
    """The journals of a work dir's store (``store``): uploaded from, and fetched into, this
    node's folder for the run."""

    def __init__(self, store: Store):
        self.store = store

    @property
    def uri(self) -> str:
        return self.store.uri

    def _here(self, local: Path, rel: str) -> bool:
        """Whether ``rel`` of the store is the folder ``local`` itself (a local work dir)."""
        return self.store.path(rel) == str(Path(local).resolve())

    def upload(self, journal: Journal) -> None:
        """Copy ``journal`` as it is now to the store (``tracking/<key>``)."""
        rel = f"{JOURNALS}/{journal.key}"
        if not self._here(journal.folder, rel):
            upload(self.store, journal.folder, rel)

    def fetch_missing(self, root: Path) -> list[str]:
        """Fetch the journals the store holds that ``root``'s ``tracking`` folder lacks; their
        keys."""
        if self._here(Path(root) / JOURNALS, JOURNALS):
            return []
        return download_missing(self.store, JOURNALS, Path(root) / JOURNALS)
