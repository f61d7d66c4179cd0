"""The one sender of a process: a background thread that drains the journals it watches to
their MLflow servers, in order, a batch a call, committing each journal's watermark after each
acknowledged call (``tracking.journal``, ``tracking.delivery``).

Nothing waits on it: stages and training ranks only append to journals. While a server does not
answer, the sender says so once, tries one record every ``probe_seconds``, and says once when it
answers again; what it could not send stays in the journals for the next process
(``tfm tracking replay``). One process sends a journal at a time (a lock file), so a record is
never sent twice at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from filesystem.redact import redact_text, redact_uri
from tracking.delivery import MAX_METRICS, Blocked, first_group, send, sent, verdict
from tracking.journal import REJECTED, Journal, Record, SendState

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from tracking.copies import JournalCopies

log = logging.getLogger(__name__)

THREAD_NAME = "tracking-sender"
POLL_SECONDS = 0.5
"""How often the thread looks for records appended by other processes (a training's relay)."""
UPLOAD_SECONDS = 30.0
"""While a server does not answer, how often a journal is uploaded to its work dir's store
(``tracking.copies``), where any machine finds it."""


@dataclass(frozen=True, kw_only=True)
class TrackingOptions:
    """How the sender talks to MLflow (the run config's ``mlflow`` section)."""

    http_retries: int = 2
    """MLflow's HTTP retries per call (MLflow's default, 7 with backoff 2, waits 254 s)."""
    http_backoff: int = 1
    """MLflow's HTTP backoff factor (MLflow's default: 2)."""
    http_timeout: int = 10
    """Seconds one call waits for an answer (MLflow's default: 120)."""
    drain_seconds: float = 60.0
    """At the end of a stage or a command, how long to wait for the journals to reach a server
    that answers, before leaving the rest for later."""
    probe_seconds: float = 2.0
    """While a server does not answer, seconds between two tries."""

    def http_environment(self) -> dict[str, str]:
        """MLflow's HTTP budget as its environment variables: MLflow's client reads them at
        every call and takes them from nowhere else, so a process sets them once at its start."""
        return {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.http_retries),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(self.http_backoff),
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(self.http_timeout),
        }


class _QuietRetries(logging.Filter):
    """Drops urllib3's line per retried call (every probe of an outage) from the sender's
    thread: it says once that the server does not answer and once that it answers again."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD_NAME


@dataclass
class _Watched:
    journal: Journal
    uri: str
    copies: JournalCopies | None = None
    uploaded: float = 0.0


def _mlflow_client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def reason(exc: BaseException) -> str:
    """One line for a failed call, credentials masked."""
    text = redact_text(str(exc).splitlines()[0] if str(exc) else "")[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Sender:
    """Drains watched journals to their servers: a thread (``start``), or the caller's thread
    (``deliver_now``: ``tfm tracking replay``)."""

    def __init__(
        self,
        options: TrackingOptions | None = None,
        say: Callable[[str], object] | None = None,
        client_for: Callable[[str], MlflowClient] | None = None,
    ):
        self.options = options or TrackingOptions()
        self.say = say if say is not None else (lambda line: log.warning("tracking: %s", line))
        self.client_for = client_for or _mlflow_client
        self._watched: dict[str, _Watched] = {}
        self._cond = threading.Condition()
        self._busy = threading.Lock()  # one delivery at a time in this process
        self._retry_at: dict[str, float] = {}  # a server that does not answer -> next try
        self._failures = 0  # tries a server did not answer, so far
        self._clients: dict[str, MlflowClient] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()  # the running thread's: a new thread gets a new one

    # ------------------------------------------------------------------ what callers use

    def watch(self, journal: Journal, uri: str, copies: JournalCopies | None = None) -> None:
        """Send ``journal`` to ``uri`` (from now on, as records arrive); while the server does
        not answer, upload it to ``copies``."""
        with self._cond:
            watched = self._watched.setdefault(str(journal.folder), _Watched(journal, uri, copies))
            watched.uri, watched.copies = uri, copies or watched.copies
            self._cond.notify_all()

    def wake(self) -> None:
        """Records were appended in this process: send them now."""
        with self._cond:
            self._cond.notify_all()

    def start(self) -> None:
        # MLflow imported here first: its package has import cycles, and a first import in this
        # thread and the caller's at once hands one of them a partly made module (an
        # ImportError of `mlflow.tracking._get_store` in a stage that asked the registry).
        import mlflow  # noqa: F401

        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                pool = logging.getLogger("urllib3.connectionpool")
                if not any(isinstance(f, _QuietRetries) for f in pool.filters):
                    pool.addFilter(_QuietRetries())
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop,), name=THREAD_NAME, daemon=True
                )
                self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """End the thread after the call it is making (waited for unless not ``wait``: a call to
        a server that does not answer takes its whole HTTP budget); the journals keep what it
        did not send."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        if self._thread is not None and wait:
            self._thread.join()
        self._thread = None

    def down(self, uri: str) -> bool:
        """Whether the server at ``uri`` did not answer the last call."""
        return uri in self._retry_at

    def delivered(self, journal: Journal, upto: int | None = None) -> bool:
        """Whether the server has ``journal`` up to byte ``upto`` (default: all of it; a record
        it refused counts as had: it is kept aside, not sent again)."""
        return journal.state().sent >= (journal.size() if upto is None else upto)

    def flush(
        self, journals: Iterable[Journal], timeout: float, *, while_down: bool = False
    ) -> bool:
        """Wait up to ``timeout`` seconds until the servers have every record of ``journals``
        appended so far; unless ``while_down``, no longer than a try made meanwhile that a
        server did not answer. Returns whether they have."""
        targets = [(j, j.size()) for j in journals]
        deadline = time.monotonic() + timeout
        failures = self._failures
        self.wake()
        with self._cond:
            while True:
                if all(self.delivered(j, upto) for j, upto in targets):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (not while_down and self._failures > failures):
                    return False
                self._cond.wait(min(left, POLL_SECONDS))

    def deliver_now(self, journals: Sequence[Journal]) -> tuple[int, list[Journal]]:
        """Send what the watched ``journals`` hold, in this thread, until each is delivered or
        its server does not answer: the records left, and the journals another process holds
        (it sends them)."""
        busy = []
        for journal in journals:
            watched = self._watched[str(journal.folder)]
            self._retry_at.pop(watched.uri, None)  # a command asked: try now
            if self._deliver(watched) is None:
                busy.append(journal)
        left = sum(journal.count() for journal in journals if not self.delivered(journal))
        return left, busy

    def upload_pending(self) -> int:
        """Upload every watched journal that holds records the server lacks to its work dir's
        store (``copies``); the records they hold."""
        left = 0
        with self._cond:
            watched = list(self._watched.values())
        for w in watched:
            if not self.delivered(w.journal):
                left += w.journal.count()
                self._upload(w, force=True)
        return left

    # ------------------------------------------------------------------ the thread

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                progressed = self._pass()
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the process's tracking
                self.say(f"the sender failed ({reason(exc)}); records stay in their journals")
                progressed = False
            with self._cond:
                self._cond.notify_all()  # flushers look again
                if not progressed and not stop.is_set():
                    self._cond.wait(POLL_SECONDS)

    def _pass(self) -> bool:
        with self._cond:
            watched = sorted(self._watched.values(), key=lambda w: w.journal.key)
        progressed = False
        for w in watched:
            if self.delivered(w.journal):
                continue
            retry_at = self._retry_at.get(w.uri)
            if retry_at is not None and time.monotonic() < retry_at:
                self._upload(w)
                continue
            progressed |= bool(self._deliver(w))
        return progressed

    def _deliver(self, w: _Watched) -> bool | None:
        """Send ``w``'s journal from its watermark on, a group a call, until it is all sent or
        a call fails; whether anything was sent (None: another process holds it)."""
        journal, progressed, reset = w.journal, False, False
        refused: list[tuple[Record, BaseException]] = []
        one_by_one = 0  # after a refused batch: its records one at a time, up to this offset
        with self._busy, journal.sending() as mine:
            if not mine:
                return None  # another process sends it now
            state = journal.state()
            try:
                while True:
                    # While the server does not answer, a try is one record, not a batch.
                    single = w.uri in self._retry_at or state.sent < one_by_one
                    group = first_group(
                        list(journal.read(state.sent, limit=1 if single else MAX_METRICS))
                    )
                    if not group:
                        return progressed
                    records = [r for r, _ in group]
                    try:
                        send(self._client(w.uri), journal, state, records, self._resolver(journal))
                    except Blocked:
                        return progressed
                    except Exception as exc:  # noqa: BLE001 - any failure is judged by verdict
                        what = verdict(exc)
                        if what == "outage":
                            self._outage(w, exc)
                            return progressed
                        if what == "gone" and not reset:
                            reset, state = True, SendState()  # sent again from the start
                            continue
                        if len(group) > 1:
                            one_by_one = group[-1][1]  # so that one bad record takes no other along
                            continue
                        refused.append((records[0], exc))
                        journal.set_aside(records)
                    state.sent = group[-1][1]
                    journal.commit(state)
                    sent(journal, records)
                    self._answered(w.uri)
                    progressed = True
            finally:
                if refused:
                    self.say(
                        f"the MLflow server at {redact_uri(w.uri)} refused {len(refused)} "
                        f"record(s) of journal {journal.key} ({reason(refused[-1][1])}); "
                        f"kept in {journal.folder / REJECTED}"
                    )

    def _outage(self, w: _Watched, exc: BaseException) -> None:
        self._failures += 1
        if w.uri not in self._retry_at:
            self.say(
                f"the MLflow server is unreachable at {redact_uri(w.uri)} ({reason(exc)}); "
                f"records are kept in {w.journal.folder.parent} and sent in order when it "
                "answers; the stages go on"
            )
        self._retry_at[w.uri] = time.monotonic() + self.options.probe_seconds
        self._upload(w)

    def _answered(self, uri: str) -> None:
        if self._retry_at.pop(uri, None) is not None:
            self.say(
                f"the MLflow server answers again at {redact_uri(uri)}; the records kept "
                "meanwhile are being sent in order"
            )

    def _upload(self, w: _Watched, force: bool = False) -> None:
        if w.copies is None or (not force and time.monotonic() - w.uploaded < UPLOAD_SECONDS):
            return
        w.uploaded = time.monotonic()
        try:
            w.copies.upload(w.journal)
        except Exception as exc:  # noqa: BLE001 - the local journal still holds everything
            log.warning(
                "tracking: could not upload %s to %s (%s)",
                w.journal.folder,
                w.copies.uri,
                reason(exc),
            )

    def _client(self, uri: str) -> MlflowClient:
        if uri not in self._clients:
            self._clients[uri] = self.client_for(uri)
        return self._clients[uri]

    @staticmethod
    def _resolver(journal: Journal) -> Callable[[str], str | None]:
        root = journal.folder.parent
        return lambda key: Journal(root / key).state().run_id
