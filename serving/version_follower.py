"""The version a served model URI names, loaded, and kept current: with an alias
(``models:/NAME@ALIAS``) a thread looks every ``poll_seconds`` where it points, loads a new
version beside the one serving, then swaps them, so no request fails and each is decoded by the
version that tokenized it."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from filesystem.redact import redact_text
from serving.registered_version import download, load_translator, pinned_uri, resolve
from serving.scoring_protocol import RequestLimits, piece_limit
from serving.serve_config import ServeConfig
from serving.translator import Translator

__all__ = ["LoadedVersion", "VersionFollower"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LoadedVersion:
    """One registered version in memory, as a replica serves it."""

    name: str
    version: int
    translator: Translator
    limits: RequestLimits
    """The server's limits (``serve.limits``)."""
    pieces: int
    """The most subword pieces a text may have (``piece_limit``)."""
    folder: Path
    """Where its files were downloaded (removed once another version replaces it)."""


class VersionFollower:
    """``current``: the version ``model_uri`` names, loaded at construction; with an alias and
    ``settings.poll_seconds`` > 0, followed by a daemon thread until ``close``."""

    def __init__(self, model_uri: str, tracking_uri: str | None, settings: ServeConfig):
        self.model_uri = model_uri
        self.tracking_uri = tracking_uri
        self.settings = settings
        name, version, self.alias = resolve(model_uri, tracking_uri)
        self.current = self._load(name, version)
        self._stop = threading.Event()
        if self.alias is not None and settings.poll_seconds > 0:
            threading.Thread(target=self._follow, daemon=True, name="follow-alias").start()

    def _load(self, name: str, version: int) -> LoadedVersion:
        folder = Path(tempfile.mkdtemp(prefix=f"tfm-serve-{name}-{version}-"))
        try:
            files = download(pinned_uri(name, version), folder, self.tracking_uri)
            s = self.settings
            translator = load_translator(files, s.engine, s.compute_type, s.engine_threads)
            pieces = piece_limit(s.limits, translator.max_src_len)
            # One sentence decoded: the first request does not pay for the engine's start.
            translator.translate_ids(translator.encode(["warm up"]))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        log.info("loaded %s version %d (engine %s)", name, version, translator.engine.name)
        return LoadedVersion(name, version, translator, s.limits, pieces, folder)

    def check(self) -> bool:
        """Look where the alias points; load and swap in a new version. Whether it swapped."""
        name, version, _ = resolve(self.model_uri, self.tracking_uri)
        old = self.current
        if version == old.version and name == old.name:
            return False
        self.current = self._load(name, version)
        # Requests already tokenized by the old version hold it and finish on it.
        shutil.rmtree(old.folder, ignore_errors=True)
        log.warning(
            "%s now serves %s version %d (was version %d)",
            self.model_uri,
            name,
            version,
            old.version,
        )
        return True

    def _follow(self) -> None:
        while not self._stop.wait(self.settings.poll_seconds):
            try:
                self.check()
            except Exception as exc:  # the registry down, a version that cannot load: keep on
                log.warning(
                    "%s: still version %d; could not follow %r: %s",
                    self.model_uri,
                    self.current.version,
                    self.alias,
                    redact_text(str(exc).splitlines()[0][:300]) if str(exc) else type(exc),
                )

    def close(self) -> None:
        """Stop following and remove the current version's files."""
        self._stop.set()
        shutil.rmtree(self.current.folder, ignore_errors=True)
