"""Who owns a journal's run, whether that process still lives, and the runs of owners that died.

A run's ``open`` record names its owner (``Owner``): the host, the process id and the process's
start time, which tells a pid the system gave to a new process since. A process killed outright
(SIGKILL, the out-of-memory killer, a power cut) ends none of its runs, and MLflow has no
liveness check: they would stay RUNNING. The next command of the work dir ends them as KILLED
(``end_abandoned``), at the time of the owner's last record; ``tfm status`` names them
(``killed_runs``). Only an owner on this host (and in its pid namespace) can be judged: a run
of another host is left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from tracking.journal import JOURNALS, Journal, Record, journals, now_ms, status_record

TAIL_BYTES = 64 << 10
"""How much of a journal's end is read to find its last record (a run that ended)."""
START_SLACK = 1.0
"""Seconds two readings of one process's start time may differ (the kernel's boot time moves
with clock adjustments); a reused pid starts later than that."""
ENDED = ("FINISHED", "FAILED", "KILLED")


@dataclass(frozen=True)
class Owner:
    """The process that opened a run."""

    host: str
    pid: int
    started: float
    """The process's start time (seconds since the epoch, ``psutil``'s ``create_time``)."""
    pid_ns: str | None = None
    """The pid namespace (a container has its own), where the system says; None elsewhere."""

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, fields: Any) -> Owner | None:
        """The owner a record names; None for a record without one (an older version's)."""
        try:
            return cls(**fields)
        except TypeError:
            return None


def this_process() -> Owner:
    """This process, as an ``open`` record names its owner."""
    return Owner(socket.gethostname(), os.getpid(), psutil.Process().create_time(), _pid_ns())


def _pid_ns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def gone(owner: Owner) -> bool | None:
    """Whether ``owner`` has ended: its pid is gone, a zombie, or another process's (started at
    another time); None where this machine cannot tell (another host or pid namespace)."""
    if owner.host != socket.gethostname() or owner.pid_ns != _pid_ns():
        return None
    try:
        process = psutil.Process(owner.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        return abs(process.create_time() - owner.started) > START_SLACK
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False  # a process we may not inspect is alive


@dataclass(frozen=True)
class Standing:
    """Where a journal's run stands, as its records say."""

    journal: Journal
    first: Record
    """Its first ``open`` record: the run's name, tags and parent."""
    owner: Owner | None
    """The owner its last ``open`` names (None: ended, or an older version's journal)."""
    end: Record | None
    """The status record that ended it after its last ``open``; None while it runs."""
    last_t: int
    """When its last record was made (ms)."""

    @property
    def top(self) -> bool:
        """A command's outermost run (a flow's, a ``tfm stage``'s), not a stage under a flow."""
        return not self.first.get("parent")

    def label(self) -> str:
        """The run as a person finds it in MLflow: its id, or its journal's tag."""
        run_id = self.journal.state().run_id
        return run_id if run_id else f"tag tfm.journal = {self.journal.key}"


def standing(journal: Journal) -> Standing | None:
    """``journal``'s standing (None: no ``open`` record yet): from its last record when that
    ended it, else from all of them."""
    first = next(journal.records("open"), None)
    if first is None:
        return None
    last = _last_record(journal)
    if last is not None and last["kind"] == "status" and last["status"] in ENDED:
        return Standing(journal, first, None, last, last["t"])
    owner, end, last_t = None, None, first["t"]
    for record in journal.records():
        last_t = record["t"]
        if record["kind"] == "open":
            owner, end = Owner.of(record.get("owner")), None
        elif record["kind"] == "status" and record["status"] in ENDED:
            end = record
    return Standing(journal, first, None if end else owner, end, last_t)


def _last_record(journal: Journal) -> Record | None:
    try:
        with open(journal.path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().split(b"\n")[:-1]  # after the last newline: nothing, or half a line
    except FileNotFoundError:
        return None
    for line in reversed(lines[1:] if size > TAIL_BYTES else lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line a crash cut short
        if isinstance(record, dict) and "kind" in record:
            return record
    return None


def killed_record(owner: Owner, last_t: int) -> Record:
    """The end of a run whose ``owner`` died: KILLED at ``last_t``, its last sign of life (MLflow
    takes it as the run's end time), with the owner and when its death was noticed."""
    return {**status_record("KILLED"), "t": last_t, "owner": owner.fields(), "noticed": now_ms()}


@dataclass(frozen=True)
class Killed:
    """A command's run whose process died: its outermost run, and how it was ended."""

    run: Standing
    owner: Owner
    last_t: int
    ended_t: int | None
    """When its runs were ended as KILLED; None: not yet (the next command ends them)."""

    def line(self) -> str:
        """What ``tfm status`` and the next command say of it, in one line."""
        tags = self.run.first.get("tags") or {}
        kind = "flow run" if "pipeline" in tags else "stage run" if "stage" in tags else "run"
        said = (
            f"{kind} {self.run.first.get('name')} ({self.run.label()}) was killed: process "
            f"{self.owner.pid} on {self.owner.host} died after its last record at "
            f"{_utc(self.last_t)}; "
        )
        if self.ended_t is None:
            return said + (
                "the next `tfm run`, `tfm stage` or `tfm tracking replay` of this work dir ends "
                "its MLflow runs as KILLED"
            )
        return said + f"its MLflow runs were ended as KILLED at {_utc(self.ended_t)}"


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _abandoned(found: Sequence[Standing]) -> dict[Owner, list[Standing]]:
    """The runs never ended whose owner, on this host, has died, by owner."""
    by_owner: dict[Owner, list[Standing]] = {}
    for s in found:
        if s.end is None and s.owner is not None:
            by_owner.setdefault(s.owner, []).append(s)
    return {owner: runs for owner, runs in by_owner.items() if gone(owner)}


def _outermost(runs: Sequence[Standing]) -> Standing:
    return next((s for s in runs if s.top), runs[0])


def end_abandoned(root: Path) -> list[Killed]:
    """End as KILLED every run of ``root``'s journals whose owner on this host has died (the
    sender then sends the end as any record); one ``Killed`` per owner."""
    if not (Path(root) / JOURNALS).is_dir():
        return []
    killed = []
    with _one_at_a_time(Path(root) / JOURNALS):
        found = [s for s in map(standing, journals(root)) if s is not None]
        for owner, runs in _abandoned(found).items():
            last_t = max(s.last_t for s in runs)
            record = killed_record(owner, last_t)
            for s in runs:
                s.journal.append([record])
                s.journal.close()
            killed.append(Killed(_outermost(runs), owner, last_t, record["noticed"]))
    return killed


@contextlib.contextmanager
def _one_at_a_time(folder: Path) -> Iterator[None]:
    """Two commands starting together: the second finds the runs the first ended. The lock is
    opened read-only (flock needs no more), so a work dir shared by several users (a cluster's
    pipeline user and an operator's `tfm status`) locks for each of them."""
    fd = os.open(folder / "end.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def killed_runs(root: Path) -> list[Killed]:
    """The outermost runs of ``root``'s journals that were killed, ended as KILLED already or
    not yet, since the same command last ended otherwise (FINISHED or FAILED); changes
    nothing."""
    found = [s for s in map(standing, journals(root)) if s is not None]
    killed = [
        Killed(_outermost(runs), owner, max(s.last_t for s in runs), None)
        for owner, runs in _abandoned(found).items()
    ]
    for s in found:
        owner = Owner.of(s.end.get("owner")) if s.end and s.end["status"] == "KILLED" else None
        if s.top and s.end is not None and owner is not None:
            killed.append(Killed(s, owner, s.end["t"], s.end.get("noticed")))
    since = {
        s.first.get("name"): s.journal.key
        for s in found
        if s.top and s.end is not None and s.end["status"] != "KILLED"
    }
    return sorted(
        (k for k in killed if k.run.journal.key > since.get(k.run.first.get("name"), "")),
        key=lambda k: k.run.journal.key,
    )
