"""Host batches for the coming steps, collated (and pinned) in a background thread.

A thread rather than a torch DataLoader: the batches are the seeded stream's, whose cursor a
checkpoint stores, and a thread reading its own copy of that stream keeps them in step with it
without worker processes. Collating is numpy work that releases the GIL for most of its time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np
import torch

from training.data import BatchStream

Batches = list[np.ndarray]
HostStep = tuple[Batches, list[tuple[torch.Tensor, ...]]]


class Prefetcher:
    """Reads ``stream`` ahead ``depth`` steps: each step takes ``per_step`` batches, collates the
    ones ``mine`` selects with ``collate`` and, with ``pin``, pins them for non-blocking copies."""

    def __init__(
        self,
        stream: BatchStream,
        per_step: int,
        mine: slice,
        collate: Callable[[np.ndarray], tuple[torch.Tensor, ...]],
        depth: int,
        pin: bool,
    ):
        self._stream, self._per_step, self._mine = stream, per_step, mine
        self._collate, self._pin = collate, pin
        self._queue: queue.Queue[HostStep | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batches = self._stream.take(self._per_step)
                host = [self._collate(rows) for rows in batches[self._mine]]
                if self._pin:
                    host = [tuple(t.pin_memory() for t in tensors) for tensors in host]
                self._put((batches, host))
        except BaseException as error:  # handed to the training thread, raised there
            self._put(error)

    def _put(self, item: HostStep | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> HostStep:
        """The next step's batches (row indices) and this rank's collated micro-batches."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
