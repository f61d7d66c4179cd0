"""What a command opens for its runs: a ``Session``, the one sender of their journals
(``tracking.sender``), the work dirs it watches and the last journal key it made; and where a
run is recorded (``Target``: the journals' folder, the server, the copies another machine
finds), what a command's end says about records left, and ``tfm tracking replay``.

A journal names its server without the secret (``filesystem.redact.without_credentials``) and
says where the secret came from (``SECRET_SOURCES``): a later process takes it again from there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filesystem.redact import redact_uri, without_credentials
from tracking.copies import JournalCopies
from tracking.journal import JOURNALS, Journal, journals, new_key
from tracking.owner import end_abandoned, killed_runs
from tracking.sender import Sender, TrackingOptions

log = logging.getLogger(__name__)

SECRET_SOURCES = ("config", "environment")
"""Where a tracking URI's secret comes from: the run config's ``mlflow.tracking_uri``, or the
``MLFLOW_TRACKING_URI`` the process found at its start."""


@dataclass(frozen=True)
class Target:
    """Where a config's runs are recorded and sent."""

    root: Path
    """This node's folder for the work dir: its ``tracking`` folder holds the journals."""
    uri: str
    """The tracking URI, its secret with it: held in memory, never written."""
    experiment: str
    secrets: Mapping[str, str] = field(default_factory=dict)
    """The tracking URIs this process found, by where it found them (``SECRET_SOURCES``)."""
    copies: JournalCopies | None = None
    """Where another machine finds the journals (the work dir's store)."""
    options: TrackingOptions = TrackingOptions()
    workdir: str = ""
    """The work dir as a person names it (what ``tfm tracking replay`` takes)."""

    @property
    def secret_from(self) -> str | None:
        """Where ``uri`` came from, for a later process to take its secret from."""
        return next((name for name, uri in self.secrets.items() if uri == self.uri), None)


def uri_of(journal: Journal, secrets: Mapping[str, str]) -> str:
    """The tracking URI a journal goes to: the server its meta names, with the secret from
    where the first process took it (``secrets``) when that names the same server; an older
    journal names the URI with its password masked."""
    meta = journal.meta()
    server = meta.get("server")
    if server is None:
        named = meta.get("tracking_uri") or ""
        return next((uri for uri in secrets.values() if redact_uri(uri) == named), named)
    uri = secrets.get(meta.get("secret_from") or "")
    return uri if uri is not None and without_credentials(uri) == server else server


def end_killed(root: Path, say: Callable[[str], object]) -> None:
    """End as KILLED the runs of ``root``'s journals whose process on this host died without
    ending them (``tracking.owner``); one line per such process. Housekeeping, never a reason
    for a command to stop: a journal this user may not write (another user's, in a shared work
    dir) stays as it is, and the run log says why."""
    try:
        ended = end_abandoned(root)
    except OSError as exc:
        log.info("tracking: the runs of killed processes in %s stay as they are: %s", root, exc)
        return
    for one in ended:
        say(one.line())


def killed(root: Path) -> list[str]:
    """What ``tfm status`` says of the runs under ``root`` that were killed, changing nothing."""
    return [k.line() for k in killed_runs(root)]


class Session:
    """What a command opens for its runs: one sender thread for every journal it sends."""

    def __init__(self, options: TrackingOptions, say: Callable[[str], object] | None = None):
        self.sender = Sender(options, say=say)
        self._roots: set[Path] = set()
        self._last_key = ""
        self._lock = threading.Lock()

    def new_key(self) -> str:
        """A journal key that sorts after every key this session made before it."""
        with self._lock:
            self._last_key = new_key(after=self._last_key)
            return self._last_key

    def watch(self, target: Target) -> None:
        """Send every journal of ``target``'s work dir, what earlier processes left too (sent
        first, being older); the first time, the runs of a process killed ended first."""
        self.sender.options = target.options
        with self._lock:
            first = target.root not in self._roots
            self._roots.add(target.root)
        if first:
            end_killed(target.root, say=lambda line: log.warning("tracking: %s", line))
            left: dict[str, int] = {}
            for journal in journals(target.root):
                uri = uri_of(journal, target.secrets)
                self.sender.watch(journal, uri, target.copies)
                if journal.pending():
                    left[uri] = left.get(uri, 0) + journal.count()
            for uri, n in left.items():
                self.sender.say(
                    f"{n} record(s) an earlier command kept in {target.root / JOURNALS} for the "
                    f"MLflow server at {redact_uri(uri)} are being sent first, in order"
                )
        self.sender.start()

    def journal(self, target: Target, key: str | None = None) -> Journal:
        """Journal ``key`` (a new one by default) of ``target``, watched."""
        self.watch(target)
        journal = Journal.create(
            target.root,
            key or self.new_key(),
            target.uri,
            target.experiment,
            secret_from=target.secret_from,
        )
        self.sender.watch(journal, target.uri, target.copies)
        return journal

    def finish(self, target: Target, wait: bool = True) -> int:
        """Wait (``drain_seconds``, unless ``wait`` is false or the server does not answer) for
        ``target``'s journals to reach the server; say in one line what is left, kept for later.
        Returns the records left."""
        ours = journals(target.root)
        if wait and self.sender.flush(ours, self.sender.options.drain_seconds):
            return 0
        left = self.sender.upload_pending()
        if left:
            log.warning(
                "tracking: %d record(s) for the MLflow server at %s are kept in %s; the next "
                "`tfm run` or `tfm stage` of this work dir sends them, or "
                "`tfm tracking replay %s` now",
                left,
                redact_uri(target.uri),
                target.root / JOURNALS,
                target.workdir or target.root,
            )
        return left

    def close(self, wait: bool = True) -> None:
        """End the sender's thread (not waited for unless ``wait``)."""
        self.sender.stop(wait=wait)


def replay(
    root: Path,
    copies: JournalCopies,
    options: TrackingOptions,
    secrets: Mapping[str, str],
    say: Callable[[str], object],
) -> int:
    """Send what the journals of a work dir hold (``root``: this node's folder for it; those its
    store keeps that this node lacks are fetched first), now, in order; one line per server.
    Returns the records left (the server does not answer)."""
    fetched = copies.fetch_missing(root)
    if fetched:
        say(f"fetched {len(fetched)} journal(s) from {copies.uri}/{JOURNALS}")
    end_killed(root, say)
    pending = [j for j in journals(root) if j.pending()]
    if not pending:
        say(f"nothing to send in {root / JOURNALS}")
        return 0
    replayer = Sender(options, say=say)
    by_uri: dict[str, list[Journal]] = {}
    for journal in pending:
        uri = uri_of(journal, secrets)
        replayer.watch(journal, uri, copies)
        by_uri.setdefault(uri, []).append(journal)
    left = 0
    for uri, group in by_uri.items():
        n = sum(j.count() for j in group)
        rest, busy = replayer.deliver_now(group)
        left += rest
        for journal in busy:
            say(f"{journal.folder} is being sent by another process; left to it")
        if rest:
            replayer.upload_pending()
            say(
                f"{rest} of {n} record(s) left in {root / JOURNALS}; "
                "run `tfm tracking replay` again "
                f"when the MLflow server at {redact_uri(uri)} answers"
            )
        else:
            say(f"sent {n} record(s) of {len(group)} run(s) to {redact_uri(uri)}")
    return left
