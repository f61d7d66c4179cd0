"""One MLflow run's tracking journal: every record of the run (its opening, params, tags,
metrics, artifacts, its end), in the order they were made, appended to a JSON-lines file that
outlives the process, whoever makes them (the driver, a training rank through its relay).
``tracking.sender`` drains it to the server with MLflow's own client.

Hand-written because MLflow has no such thing: its async logging keeps records in memory, drops a
batch whose call fails and sends batches through a pool of threads, in no fixed order; and
creating a run needs the server, so a run opened while it is down has no MLflow id yet. A
journal is named by its own key and learns its MLflow run id when the run is created.

A journal folder ``<root>/tracking/<key>/`` holds:
- ``meta.json``: the key, the tracking server without its secret
  (``filesystem.redact.without_credentials``) and where the secret came from (the config or the
  environment: never written), the experiment; written once (an older version's holds
  ``tracking_uri``, the URI with its password masked);
- ``journal.jsonl``: the records, one JSON object a line, appended under an exclusive lock;
- ``state.json``: what the sender has: the bytes of the journal the server acknowledged (the
  watermark, replaced atomically after each acknowledged call), the run's MLflow id;
- ``artifacts/``: copies of the files logged as artifacts, until they are on the server;
- ``rejected.jsonl``: records the server refused (HTTP 400), kept for a person.

Delivery is at least once with the order kept, and the server keeps each record once: a call
sent again after a crash (between its answer and the watermark) finds its metrics there already
(MLflow keeps a metric once per key, timestamp, step and value), its params with the same
values, its tags and artifacts overwritten with themselves, its run found by the tag
``tfm.journal`` rather than created twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from filesystem.redact import without_credentials

JOURNALS = "tracking"
"""The folder of a work dir (this node's, for an object store) that holds the journals."""
RECORDS, META, STATE, REJECTED, ARTIFACTS = (
    "journal.jsonl", "meta.json", "state.json", "rejected.jsonl", "artifacts",
)  # fmt: skip
KEY_TAG = "tfm.journal"
"""The MLflow tag naming a run's journal: how a run is found again rather than created twice."""
SYNC_SECONDS = 1.0
"""A writer that appends without waiting for the disk (a training's relay) syncs at most this
often: what the kernel holds outlives the process, not the machine."""

Record = dict[str, Any]
"""One record, as JSON: ``kind`` (``open``, ``log``, ``artifact``, ``status``), ``t`` (when it
was made, ms) and the kind's fields (``open_record``, ``log_record``, ...)."""


class RecordSink(Protocol):
    """Where a writer's records go: a ``Journal`` in this process, or a relay to one."""

    def append(self, records: Sequence[Record]) -> None:
        """Add ``records`` after everything appended before them."""
        ...

    def sync(self) -> None:
        """Return once every record appended so far is in the journal, on disk."""
        ...


def now_ms() -> int:
    return int(time.time() * 1000)


def new_key(after: str = "") -> str:
    """A journal key of the time now, in a later millisecond than key ``after`` (so that it
    sorts after it): ``20261201T143000123-1a2b3c4d``."""
    while True:
        t = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t * 1000) % 1000:03d}"
        if stamp > after[:18]:
            return f"{stamp}-{secrets.token_hex(4)}"
        time.sleep(0.001)


# ----------------------------------------------------------------------------- records


def open_record(
    experiment: str,
    name: str,
    tags: Mapping[str, str],
    *,
    parent: str | None = None,
    artifact_location: str | None = None,
    owner: Mapping[str, Any] | None = None,
) -> Record:
    """Open the run: create it (in ``experiment``, under the run of journal ``parent``), or set
    it running again when it exists (a resumed training); ``owner``: the process that opens it
    (``tracking.owner``: its host, pid and start time)."""
    record: Record = {
        "kind": "open",
        "t": now_ms(),
        "experiment": experiment,
        "name": name,
        "tags": dict(tags),
        "parent": parent,
        "artifact_location": artifact_location,
    }
    if owner is not None:
        record["owner"] = dict(owner)
    return record


def log_record(
    *,
    metrics: Mapping[str, float | None] | None = None,
    step: int = 0,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    links: Mapping[str, str] | None = None,
) -> Record:
    """Metrics at ``step`` (stamped now: the stamp is what keeps a resent metric once), params,
    tags, and ``links``: tags whose value is the MLflow id of another journal's run."""
    t = now_ms()
    record: Record = {"kind": "log", "t": t}
    if metrics:
        record["metrics"] = [
            [k, float(v), t, int(step)] for k, v in metrics.items() if v is not None
        ]
    if params:
        record["params"] = [[k, str(v)[:6000]] for k, v in params.items()]
    if tags:
        record["tags"] = [[k, str(v)[:8000]] for k, v in tags.items()]
    if links:
        record["links"] = [[k, key] for k, key in links.items()]
    return record


def artifact_record(file: str, path: str | None = None) -> Record:
    """The journal's copy ``file`` (``Journal.copy_artifact``) as an artifact under ``path``."""
    return {"kind": "artifact", "t": now_ms(), "file": file, "path": path}


def status_record(status: str) -> Record:
    """The run's end (``FINISHED``, ``FAILED``, ``KILLED``), after every record before it."""
    return {"kind": "status", "t": now_ms(), "status": status}


@dataclass
class SendState:
    """What the server has of a journal."""

    sent: int = 0
    """Bytes of ``journal.jsonl`` the server acknowledged: the watermark."""
    run_id: str | None = None
    """The run's MLflow id, once created."""
    experiment_id: str | None = None


# ----------------------------------------------------------------------------- the journal


class Journal:
    """A run's journal folder (``<root>/tracking/<key>``): appends under an exclusive lock (any
    process), reads from a byte offset, the sender's watermark and the run's MLflow id."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self.path = self.folder / RECORDS
        self._fd: int | None = None
        self._synced = 0.0
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return self.folder.name

    @classmethod
    def create(
        cls,
        root: Path,
        key: str,
        tracking_uri: str,
        experiment: str,
        *,
        secret_from: str | None = None,
    ) -> Journal:
        """The journal ``key`` under ``root`` (its ``tracking`` folder), made with its meta if
        new: the server ``tracking_uri`` names, without its secret, and ``secret_from``, where
        a later process takes the secret again (``tracking.session.SECRET_SOURCES``)."""
        journal = cls(Path(root) / JOURNALS / key)
        if not (journal.folder / META).exists():
            journal.folder.mkdir(parents=True, exist_ok=True)
            server = without_credentials(tracking_uri)
            meta = {
                "key": key,
                "server": server,
                "secret_from": secret_from if server != tracking_uri else None,
                "experiment": experiment,
                "created": now_ms(),
            }
            _write_atomic(journal.folder / META, json.dumps(meta, sort_keys=True))
        return journal

    def meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.folder / META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[Record], sync: bool = True) -> None:
        """Add ``records`` at the end, whole lines under the lock; ``sync`` waits for the disk,
        else at most ``SYNC_SECONDS`` pass before a sync."""
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        if not text:
            return
        with self._lock:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                end = os.fstat(fd).st_size
                if end and os.pread(fd, 1, end - 1) != b"\n":
                    text = "\n" + text  # a writer died mid-line: its half line stays apart
                os.write(fd, text.encode("utf-8"))
                if sync or time.monotonic() - self._synced >= SYNC_SECONDS:
                    os.fsync(fd)
                    self._synced = time.monotonic()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def sync(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        return self._fd

    def copy_artifact(self, path: Path) -> str:
        """A copy of ``path`` in the journal (``artifacts/<id>/<name>``), for an ``artifact``
        record: the stage's folder may move or go before the server takes it."""
        rel = f"{ARTIFACTS}/{secrets.token_hex(6)}/{Path(path).name}"
        target = self.folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        return rel

    # ------------------------------------------------------------------ reading

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, offset: int = 0, limit: int | None = None) -> Iterator[tuple[Record, int]]:
        """Records from byte ``offset`` on, each with the offset just past it; a last line
        without its newline is not a record yet, a line a crash cut short is skipped."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(offset)
            n = 0
            for line in f:
                if not line.endswith(b"\n") or (limit is not None and n >= limit):
                    return
                offset += len(line)
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "kind" in record:
                    n += 1
                    yield record, offset

    def records(self, kind: str | None = None) -> Iterator[Record]:
        return (r for r, _ in self.read() if kind is None or r["kind"] == kind)

    def params(self) -> dict[str, str]:
        """The params logged so far (the last value of each)."""
        return {k: v for r in self.records("log") for k, v in r.get("params", ())}

    def metric_keys(self) -> set[str]:
        return {m[0] for r in self.records("log") for m in r.get("metrics", ())}

    def history(self, keys: Iterable[str]) -> dict[str, list[tuple[int, int, float]]]:
        """``key -> [(step, timestamp ms, value)]`` by step (the last value of a step logged
        twice: a training resumed before it), for the metrics ``keys``."""
        wanted = set(keys)
        found: dict[str, dict[int, tuple[int, int, float]]] = {}
        for record in self.records("log"):
            for key, value, t, step in record.get("metrics", ()):
                if key in wanted:
                    found.setdefault(key, {})[step] = (step, t, value)
        return {k: [by_step[s] for s in sorted(by_step)] for k, by_step in found.items()}

    # ------------------------------------------------------------------ the sender's side

    def state(self) -> SendState:
        try:
            data = json.loads((self.folder / STATE).read_text(encoding="utf-8"))
            return SendState(**data)
        except (OSError, ValueError, TypeError):
            return SendState()

    def commit(self, state: SendState) -> None:
        """The sender's state, replaced whole (a crash leaves the old one or the new one)."""
        _write_atomic(self.folder / STATE, json.dumps(asdict(state)))

    def pending(self) -> int:
        """Bytes of records not yet on the server."""
        return max(0, self.size() - self.state().sent)

    def count(self, offset: int | None = None) -> int:
        """Records from ``offset`` (default: the watermark) on."""
        return sum(1 for _ in self.read(self.state().sent if offset is None else offset))

    @contextlib.contextmanager
    def sending(self) -> Iterator[bool]:
        """The right to send this journal, not waited for: yields whether this process has it
        (one sender at a time, so that no record is sent twice at once)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "send.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def set_aside(self, records: Sequence[Record]) -> Path:
        """Records the server refused, appended to ``rejected.jsonl`` (not sent again)."""
        path = self.folder / REJECTED
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        return path


def journals(root: Path) -> list[Journal]:
    """Every journal under ``root``'s ``tracking`` folder, oldest first (a parent before its
    children: keys sort by time)."""
    folder = Path(root) / JOURNALS
    if not folder.is_dir():
        return []
    return [Journal(p) for p in sorted(folder.iterdir()) if (p / META).is_file()]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
