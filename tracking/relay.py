"""What a training rank writes through: its ``Tracker`` appends its records to the run's journal
(``tracking.journal``) through a ``JournalRelay`` on the driver's node, and never calls the
server. The run itself is opened by the driver (``tracking.run``), whose sender drains it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tracking.journal import Journal, Record, RecordSink, log_record

RELAY_SYNC_SECONDS = 60.0
"""How long a rank's ``close`` waits for the relay to have written its records."""


class Tracker:
    """A training rank's MLflow logging: each call appends a record to ``sink`` (the run's
    journal, or a relay to it) and returns; the sender sends it. A no-op on other ranks or
    without a run."""

    def __init__(self, sink: RecordSink | None, enabled: bool = True, out: IO[str] | None = None):
        self.sink = sink if enabled else None
        self.out = out or sys.stderr
        self._failed = False

    def metrics(self, values: Mapping[str, float | None], step: int) -> None:
        if values:
            self._append(log_record(metrics=values, step=step))

    def param(self, key: str, value: Any) -> None:
        self._append(log_record(params={key: value}))

    def tag(self, key: str, value: str) -> None:
        self._append(log_record(tags={key: value}))

    def close(self) -> None:
        """Return once every record of this rank is in the journal (the run's end comes after
        them)."""
        if self.sink is not None:
            try:
                self.sink.sync()
            except Exception as exc:  # noqa: BLE001 - tracking must not fail a training
                self._say(exc)

    def _append(self, record: Record) -> None:
        if self.sink is None:
            return
        try:
            self.sink.append([record])
        except Exception as exc:  # noqa: BLE001 - tracking must not fail a training
            self._say(exc)

    def _say(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self.out.write(
                f"tracking: records of this training are lost ({type(exc).__name__}: "
                f"{exc}); training goes on\n"
            )
            self.out.flush()


class JournalRelay:
    """A Ray actor on the driver's node (``start_relay``) that appends the records of training
    ranks, wherever they run, to the run's journal there, in the order each rank sent them."""

    def __init__(self, folder: str):
        self.journal = Journal(Path(folder))

    def append(self, records: Sequence[Record]) -> None:
        self.journal.append(records, sync=False)  # synced once a second at most, and at sync

    def sync(self) -> None:
        self.journal.sync()


@dataclass(frozen=True)
class RelaySink:
    """A ``RecordSink`` for a training rank: the relay actor's handle (it travels with the job
    to every worker). Ray runs one caller's calls to an actor in the order they were made."""

    handle: Any  # a Ray ActorHandle of JournalRelay: Ray ships no type for a handle's methods

    def append(self, records: Sequence[Record]) -> None:
        self.handle.append.remote(list(records))  # not waited for

    def sync(self) -> None:
        import ray

        ray.get(self.handle.sync.remote(), timeout=RELAY_SYNC_SECONDS)


def start_relay(folder: Path) -> RelaySink:
    """A ``JournalRelay`` for the journal ``folder``, on this process's Ray node (which holds
    the folder), taking no CPU from the workers."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(JournalRelay).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    )
    return RelaySink(actor.remote(str(folder)))


def stop_relay(sink: RelaySink) -> None:
    """Wait for the relay to have written what it was sent, then end it."""
    import ray

    try:
        sink.sync()
    finally:
        ray.kill(sink.handle)
