"""MLflow logging that never waits on the server: a bounded in-memory queue that one background
thread drains to MLflow in order, and the append-only spill file (``training.tracking_spill``)
that takes the records when the queue is full or the server is unreachable, written first, in
order, when the server is back.

Hand-written because MLflow 3.17.2's own ``log_batch(..., synchronous=False)`` does not fit: its
queue is unbounded, a batch whose call fails is logged as an error and dropped, and batches are
sent by a pool of 10 threads, so neither order nor delivery holds through an outage.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from corpora.redact import redact_text
from training.tracking_spill import (
    MAX_METRICS,
    Record,
    Sink,
    SpillFile,
    keep_refused,
    merge,
    refused,
    send,
)

THREAD_NAME = "tracking-queue"


class _QuietRetries(logging.Filter):
    """Drops urllib3's line per retried call (every probe of an outage) from the logging thread:
    the queue says once that the server is unreachable and once that it answers again instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD_NAME


def _quiet_retries() -> None:
    pool = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _QuietRetries) for f in pool.filters):
        pool.addFilter(_QuietRetries())


@dataclass
class _State:
    memory: collections.deque[Record] = field(default_factory=collections.deque)
    inflight: list[Record] = field(default_factory=list)
    spilling: bool = False
    down: bool = False
    closing: bool = False
    stopped: bool = False
    dead: bool = False
    lost: int = 0


class TrackingQueue:
    """Records to ``sink`` from a background thread, never blocking ``put``: at most
    ``capacity`` records in memory, the rest (and all of them while the server is unreachable)
    appended to ``spill``, which is written to the server first once it answers again."""

    def __init__(self, sink: Sink, spill: SpillFile, *, capacity: int = 1000,
                 probe_seconds: float = 2.0, out: IO[str] | None = None):
        self.sink, self.spill = sink, spill
        self.capacity, self.probe_seconds = capacity, probe_seconds
        self.out = out or sys.stderr
        self._state = _State(spilling=spill.pending())  # a spill file left by an earlier run
        self._cond = threading.Condition()
        self._stop = threading.Event()
        _quiet_retries()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def put(self, record: Record) -> None:
        """Queue ``record``; appended to the spill file when the queue is full or spilling."""
        s = self._state
        with self._cond:
            if s.stopped:
                return
            if s.spilling or len(s.memory) >= self.capacity:
                try:
                    self.spill.append([record], sync=False)  # no fsync on training's thread
                    s.spilling = True
                except OSError as exc:
                    s.lost += 1
                    if s.lost == 1:
                        self._say(f"cannot write the spill file {self.spill.path} ({exc}): "
                                  "tracking records are dropped until it can")
            else:
                s.memory.append(record)
            self._cond.notify_all()

    def close(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every record to reach the server; then stop and
        leave what is not there in the spill file. Returns the records left in it."""
        s = self._state
        deadline = time.monotonic() + timeout
        with self._cond:
            s.closing = True
            self._cond.notify_all()
            while not s.dead and (s.memory or s.inflight or s.spilling):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            s.stopped = True
            head = [*s.inflight, *s.memory]
            if head:
                # An in-flight call may still reach the server: at most a duplicate, which
                # the store keeps once.
                self.spill.rewrite(head)
            s.memory.clear()
            s.inflight = []
            self._cond.notify_all()
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.spill.sync_file()
        return self.spill.count()

    def _say(self, line: str) -> None:
        self.out.write(f"tracking: {line}\n")
        self.out.flush()

    def _next(self) -> tuple[list[Record], int | None] | None:
        """The next group to send and, when it comes from the spill file, the offset past it;
        None when closed and done."""
        s = self._state
        while True:
            with self._cond:
                while True:  # memory first: the file holds what came after it
                    if s.stopped:
                        return None
                    if s.memory:
                        group = merge(list(s.memory)[:MAX_METRICS])[0]
                        for _ in group:
                            s.memory.popleft()
                        s.inflight = group
                        return group, None
                    if s.spilling:
                        break
                    if s.closing:
                        self._cond.notify_all()
                        return None
                    self._cond.wait()
            # Outside the lock, so that training's put never waits for this parse (up to
            # MAX_METRICS lines at every probe of an outage): the file only grows meanwhile, and
            # only this thread commits or rewrites it.
            # While the server is down the next try is a probe: one record, not a batch to parse.
            read = list(self.spill.read(self.spill.offset(), limit=1 if s.down else MAX_METRICS))
            if read:
                group = merge([r for r, _ in read])[0]
                return group, read[len(group) - 1][1]
            with self._cond:
                if not self.spill.pending():  # written through; a put since then is in memory
                    s.spilling = False
                    self._cond.notify_all()

    def _run(self) -> None:
        try:
            self._drain()
        except Exception as exc:  # noqa: BLE001 - a bug here must not reach training
            with self._cond:
                self._state.spilling = True  # from now on every record goes to the file
                self._state.dead = True
                self._cond.notify_all()
            self._say(f"the logging thread stopped ({type(exc).__name__}: {exc}); records go "
                      f"to {self.spill.path} for `tfm tracking replay`")

    def _drain(self) -> None:
        s = self._state
        while (item := self._next()) is not None:
            group, offset = item
            try:
                send(self.sink, group)
            except Exception as exc:  # noqa: BLE001 - any failure is an outage or a refusal
                if refused(exc):
                    self._refuse(group, exc, offset)
                    continue
                self._outage(exc, offset is None)
                self._stop.wait(self.probe_seconds)  # the next try is the probe
                continue
            with self._cond:
                if s.stopped:
                    return
                if offset is not None:
                    self.spill.commit(offset)
                s.inflight = []
                if s.down:
                    s.down = False
                    self._say("the MLflow server answers again; what was spilled is being "
                              "written to it in order")
                self._cond.notify_all()

    def _outage(self, exc: BaseException, from_memory: bool) -> None:
        """Spill what the thread holds and everything queued, ahead of the file's records."""
        s = self._state
        with self._cond:
            if s.stopped:
                return
            if from_memory:
                try:
                    self.spill.rewrite([*s.inflight, *s.memory])
                    s.memory.clear()
                    s.inflight = []
                    s.spilling = True
                except OSError:
                    s.memory.extendleft(reversed(s.inflight))  # kept in memory, retried
                    s.inflight = []
            if not s.down:
                s.down = True
                reason = redact_text(str(exc).splitlines()[0] if str(exc) else "")[:200]
                self._say(f"the MLflow server is unreachable ({type(exc).__name__}: {reason}); "
                          f"training goes on, records spill to {self.spill.path} and are "
                          "written in order when it answers")
            self._cond.notify_all()

    def _refuse(self, group: Sequence[Record], exc: BaseException, offset: int | None) -> None:
        s = self._state
        self._say(keep_refused(self.spill, group, exc))
        with self._cond:
            if offset is not None and not s.stopped:
                self.spill.commit(offset)
            s.inflight = []
            self._cond.notify_all()
