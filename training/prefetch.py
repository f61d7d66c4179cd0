"""The batch stream a Trainer reads, step by step: each step's batches (row indices, every
rank's) and this rank's micro-batches collated, with the stream's position after them, which a
checkpoint stores and a resume seeks back to.

Prepared ahead in a background thread (``depth`` steps) or, with ``depth`` 0, when asked. A
thread rather than a torch DataLoader: the batches are the seeded stream's, whose cursor a
checkpoint stores, and one thread reading the one stream keeps them in order without worker
processes. Collating is numpy work that releases the GIL for most of its time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np
import torch

from training.data import BatchStream

Batches = list[np.ndarray]
HostBatches = list[tuple[torch.Tensor, ...]]
Prepared = tuple[Batches, HostBatches, dict[str, int]]
"""A step's batches, this rank's collated micro-batches and the stream's position after them."""


class Prefetcher:
    """Steps of ``stream``: each takes ``per_step`` batches and collates the ones ``mine``
    selects with ``collate`` (as one batch with ``merge``); ``depth`` > 0 prepares that many steps
    ahead in a thread (pinning them for non-blocking copies with ``pin``). ``position`` is where
    the next step starts."""

    def __init__(
        self,
        stream: BatchStream,
        per_step: int,
        mine: slice,
        collate: Callable[[np.ndarray], tuple[torch.Tensor, ...]],
        depth: int,
        pin: bool,
        merge: bool = False,
    ):
        self._stream, self._per_step, self._mine, self._merge = stream, per_step, mine, merge
        self._collate, self._depth, self._pin = collate, depth, pin
        self.position = stream.position
        self._queue: queue.Queue[Prepared | BaseException] | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def next(self) -> tuple[Batches, HostBatches]:
        """The next step's batches (row indices, every rank's) and this rank's micro-batches."""
        if self._depth == 0:
            batches, host, self.position = self._prepare(self._stream, pin=False)
            return batches, host
        if self._thread is None:
            self._start()
        assert self._queue is not None
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        batches, host, self.position = item
        return batches, host

    def seek(self, position: dict[str, int]) -> None:
        """Continue from ``position`` (a checkpoint's): the next step's batches start there."""
        self.close()
        self.position = {"epoch": int(position["epoch"]), "index": int(position["index"])}
        self._stream = self._stream.at(**self.position)

    def close(self) -> None:
        """Stop the thread; the next step starts another from ``position``."""
        if self._thread is None:
            return
        assert self._stop is not None
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = self._queue = self._stop = None
        self._stream = self._stream.at(**self.position)  # the thread read past the steps taken

    def _prepare(self, stream: BatchStream, pin: bool) -> Prepared:
        batches = stream.take(self._per_step)
        mine = batches[self._mine]
        if self._merge and len(mine) > 1:
            mine = [np.concatenate(mine)]
        host = [self._collate(rows) for rows in mine]
        if pin:
            host = [tuple(t.pin_memory() for t in tensors) for tensors in host]
        return batches, host, stream.position

    def _start(self) -> None:
        # A queue and a stop flag of its own: a thread that outlived close() feeds nobody.
        self._queue, self._stop = queue.Queue(maxsize=self._depth), threading.Event()
        args = (self._stream, self._queue, self._stop)
        self._thread = threading.Thread(
            target=self._run, args=args, name="batch-prefetch", daemon=True
        )
        self._thread.start()

    def _run(self, stream: BatchStream, out: queue.Queue, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                _put(out, stop, self._prepare(stream, self._pin))
        except BaseException as error:  # handed to the training thread, raised there
            _put(out, stop, error)


def _put(out: queue.Queue, stop: threading.Event, item: Prepared | BaseException) -> None:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue
