"""Training's tracking records on disk: ``Record`` (one logging call), the append-only JSON-lines
``SpillFile`` that keeps them while the MLflow server cannot take them, and ``replay``, which
writes such a file to the server in order, each record once (``tfm tracking replay``).

Delivery is at least once with the order kept; the store makes it exactly once: MLflow keeps a
metric once per (key, timestamp, step, value) (a record keeps the timestamp of its logging call),
a param logged again with the same value is accepted, and a tag is overwritten with itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corpora.redact import redact_text

SPILL_FILE = "tracking_spill.jsonl"
"""The spill file's name, in the folder the queue is given (the Ray Train run folder by default)."""
OFFSET_SUFFIX = ".offset"
"""``<spill>.offset`` holds the bytes of the spill file already written to the server."""
REJECTED_FILE = "tracking_rejected.jsonl"
"""Records the server refused (HTTP 400: a changed param, an invalid value), kept for a person."""
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
"""MLflow's limits for one ``log_batch`` call."""


class Sink(Protocol):
    """Where records go: ``MlflowClient`` (``log_batch``, ``set_terminated``)."""

    def log_batch(self, run_id: str, metrics: Sequence[Any] = (), params: Sequence[Any] = (),
                  tags: Sequence[Any] = ()) -> Any: ...

    def set_terminated(self, run_id: str, status: str | None = None,
                       end_time: int | None = None) -> Any: ...

    def get_run(self, run_id: str) -> Any: ...


@dataclass(frozen=True)
class Record:
    """One logging call: metrics as ``(key, value, timestamp_ms, step)``, params and tags as
    ``(key, value)``; ``status`` ends the run (``set_terminated``) after the rest is logged."""

    run_id: str
    metrics: tuple[tuple[str, float, int, int], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    status: str | None = None
    end_time: int | None = None
    new_metrics_only: bool = False
    """Drop the metrics the run already has when sent (a stage's stats beside training's curves,
    decided at the stage's end when the server could not be asked)."""

    def to_json(self) -> str:
        data: dict[str, Any] = {"run_id": self.run_id}
        for name in ("metrics", "params", "tags", "status", "end_time", "new_metrics_only"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Record:
        data = json.loads(line)
        return cls(
            run_id=data["run_id"],
            metrics=tuple((k, float(v), int(t), int(s)) for k, v, t, s in data.get("metrics", ())),
            params=tuple((k, v) for k, v in data.get("params", ())),
            tags=tuple((k, v) for k, v in data.get("tags", ())),
            status=data.get("status"),
            end_time=data.get("end_time"),
            new_metrics_only=bool(data.get("new_metrics_only")),
        )

    @property
    def size(self) -> int:
        return len(self.metrics) + len(self.params) + len(self.tags)


def metrics_record(run_id: str, values: Mapping[str, float | None], step: int) -> Record:
    """A record of ``values`` at ``step``, stamped now (the stamp makes a replay idempotent)."""
    now = int(time.time() * 1000)
    return Record(run_id, metrics=tuple((k, float(v), now, step) for k, v in values.items()
                                        if v is not None))


def merge(records: Sequence[Record]) -> list[list[Record]]:
    """Consecutive records grouped into ``log_batch`` calls: metrics of one run together within
    MLflow's limits; a record with params, tags or a status alone (a refused param must not take
    the metrics beside it down with it, and a status comes after what precedes it)."""
    groups: list[list[Record]] = []
    for record in records:
        last = groups[-1] if groups else None
        if (
            last is not None
            and _metrics_only(record)
            and _metrics_only(last[0])  # a group grows only from a metrics-only record
            and last[0].run_id == record.run_id
            and sum(len(r.metrics) for r in last) + len(record.metrics) <= MAX_METRICS
        ):
            last.append(record)
        else:
            groups.append([record])
    return groups


def _metrics_only(record: Record) -> bool:
    return bool(record.metrics) and not (record.params or record.tags or record.status
                                         or record.new_metrics_only)


def send(sink: Sink, group: Sequence[Record]) -> None:
    """One group (``merge``) to ``sink``: a ``log_batch`` per MLflow limit, then the status."""
    from mlflow.entities import Metric, Param, RunTag

    run_id = group[0].run_id
    metrics = [Metric(k, v, t, s) for r in group for k, v, t, s in r.metrics]
    if any(r.new_metrics_only for r in group):
        logged = sink.get_run(run_id).data.metrics
        metrics = [m for m in metrics if m.key not in logged]
    params = [Param(k, v) for r in group for k, v in r.params]
    tags = [RunTag(k, v) for r in group for k, v in r.tags]
    calls = max(-(-len(metrics) // MAX_METRICS), -(-len(params) // MAX_PARAMS),
                -(-len(tags) // MAX_TAGS))
    for i in range(calls):
        sink.log_batch(run_id, metrics=metrics[i * MAX_METRICS : (i + 1) * MAX_METRICS],
                       params=params[i * MAX_PARAMS : (i + 1) * MAX_PARAMS],
                       tags=tags[i * MAX_TAGS : (i + 1) * MAX_TAGS])
    for r in group:
        if r.status:
            sink.set_terminated(run_id, r.status, r.end_time)


def refused(exc: BaseException) -> bool:
    """The server answered and refused the record (HTTP 400: a param logged again with another
    value, an invalid key): sending it again cannot help. Anything else is an outage."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.get_http_status_code() == 400


class SpillFile:
    """An append-only JSON-lines file of records and ``<file>.offset``, the bytes of it already
    written to the server; both removed once every record is written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset_path = self.path.with_name(self.path.name + OFFSET_SUFFIX)

    def append(self, records: Iterable[Record], sync: bool = True) -> None:
        """Add ``records`` at the end; ``sync`` waits for the disk (fsync). Without it they are
        in the kernel's cache, which outlives this process, not the machine: training's own
        thread appends so, as one fsync took up to a second on a busy disk (``sync_file``)."""
        text = "".join(r.to_json() + "\n" for r in records)
        if not text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.size() and not self._ends_a_line():
            text = "\n" + text  # a writer died mid-line: its half line stays apart, skipped
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())

    def sync_file(self) -> None:
        """Wait for the disk to hold what was appended without ``sync``."""
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            os.fsync(f.fileno())

    def _ends_a_line(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def offset(self) -> int:
        try:
            return int(self.offset_path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def pending(self) -> bool:
        return self.size() > self.offset()

    def count(self) -> int:
        """Records not yet written to the server."""
        return sum(1 for _ in self.read(self.offset()))

    def read(self, offset: int, limit: int | None = None) -> Iterator[tuple[Record, int]]:
        """Records from byte ``offset`` on, each with the offset just past it; a last line
        without its newline is not a record yet, and a line a crash cut short is skipped."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(offset)
            n = 0
            for line in f:
                if not line.endswith(b"\n") or (limit is not None and n >= limit):
                    return
                offset += len(line)
                try:
                    record = Record.from_json(line.decode("utf-8"))
                except (ValueError, KeyError, TypeError):
                    continue
                n += 1
                yield record, offset

    def commit(self, offset: int) -> None:
        """Records up to byte ``offset`` are on the server; the file goes once all are."""
        if offset >= self.size():
            self.clear()
            return
        tmp = self.offset_path.with_name(self.offset_path.name + ".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.offset_path)

    def rewrite(self, head: Sequence[Record]) -> None:
        """``head`` before the records not yet written, atomically (an outage seen while the
        thread held older records than the file's: they go first, as they were logged first).
        No fsync: it runs under the lock training's ``put`` takes (``sync_file`` at the end)."""
        rest = [r for r, _ in self.read(self.offset())]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(r.to_json() + "\n" for r in (*head, *rest)))
        os.replace(tmp, self.path)
        self.offset_path.unlink(missing_ok=True)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.offset_path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def locked(self, wait: bool | float = True) -> Iterator[bool]:
        """An exclusive lock on the spill file (one writer: a training or a replay); yields
        whether it was taken: ``wait`` True waits for it, False does not, a number waits at most
        that many seconds."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + (0.0 if wait is False else float(wait))
        with open(self.path.with_name(self.path.name + ".lock"), "a") as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | (0 if wait is True else fcntl.LOCK_NB))
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.2)
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def keep_refused(spill: SpillFile, group: Sequence[Record], exc: BaseException) -> str:
    """Append records the server refused to ``tracking_rejected.jsonl`` beside ``spill``; the
    line that says so."""
    rejected = spill.path.with_name(REJECTED_FILE)
    rejected.parent.mkdir(parents=True, exist_ok=True)
    with open(rejected, "a", encoding="utf-8") as f:
        f.writelines(r.to_json() + "\n" for r in group)
    reason = redact_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return f"the MLflow server refused {len(group)} record(s) ({reason[:300]}); kept in {rejected}"


def replay(sink: Sink, spill: SpillFile, say: Callable[[str], object] = print) -> int:
    """Write a spill file's records to ``sink`` in order, now (``tfm tracking replay``); stops
    at the first failure that is not a refusal. Returns the records left (0: file removed)."""
    while True:
        read = list(spill.read(spill.offset(), limit=MAX_METRICS))
        if not read:
            spill.clear()
            return 0
        group = merge([r for r, _ in read])[0]
        try:
            send(sink, group)
        except Exception as exc:  # noqa: BLE001 - a refusal is kept aside, anything else stops
            if not refused(exc):
                reason = redact_text(str(exc).splitlines()[0] if str(exc) else "")
                say(f"the MLflow server is unreachable ({type(exc).__name__}: {reason[:200]})")
                return spill.count()
            say(keep_refused(spill, group, exc))
        spill.commit(read[len(group) - 1][1])
