"""The Run API of stages: a run as this process writes it (``Run``: params, tags, links,
artifacts, its end, its relay for a training's ranks), the run of the code running now
(``current``), and a run's lifetime (``open_run``, ``running``).

Every record goes to the run's journal (``tracking.journal``), never straight to the server;
the session's sender (``tracking.session``) drains the journals in order. The outermost run of
a command opens the session when none is open and closes it at its end; the runs inside it, in
the same context (a flow's stages in Prefect's threads too), share it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tracking.curve import learning_curve
from tracking.delivery import MAX_PARAMS
from tracking.journal import (
    Journal,
    Record,
    artifact_record,
    log_record,
    open_record,
    status_record,
)
from tracking.owner import this_process
from tracking.relay import RelaySink, start_relay, stop_relay
from tracking.session import Session, Target

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("tracked_run", default=None)
_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "tracking_session", default=None
)


class Run:
    """A run as this process writes it: its journal, which the session's sender drains."""

    def __init__(self, journal: Journal, target: Target, session: Session, owns_session: bool):
        self.journal, self.target, self.session = journal, target, session
        self.owns_session = owns_session
        """Whether the run opened its session (none was open): it closes it at its end."""

    @property
    def key(self) -> str:
        """The journal's key: the run's name before the server gives it an id (its tag
        ``tfm.journal`` in MLflow)."""
        return self.journal.key

    @property
    def run_id(self) -> str | None:
        """The run's MLflow id, once the server has created it."""
        return self.journal.state().run_id

    def label(self) -> str:
        """The run as a person finds it: its MLflow id, or its journal before the server has it."""
        return self.run_id or f"not yet on the server (tag tfm.journal = {self.key})"

    def append(self, records: list[Record]) -> None:
        self.journal.append(records)
        self.session.sender.wake()

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = list(params.items())
        self.append(
            [
                log_record(params=dict(items[i : i + MAX_PARAMS]))
                for i in range(0, len(items), MAX_PARAMS)
            ]
        )

    def log_new_params(self, params: Mapping[str, Any]) -> None:
        """The params the run does not have yet; a changed value (more steps on a resume)
        becomes a tag ``param_changed.<key>`` (MLflow refuses to change a param)."""
        existing = self.journal.params()
        new, changed = {}, {}
        for key, value in params.items():
            text = str(value)[:6000]
            if key not in existing:
                new[key] = text
            elif existing[key] != text:
                changed[f"param_changed.{key}"] = text
        if new or changed:
            self.append([log_record(params=new, tags=changed)])

    def logged_metrics(self) -> set[str]:
        """The keys of the metrics logged into the run so far."""
        return self.journal.metric_keys()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.append([log_record(tags=tags)])

    def link(self, tag: str, other: str) -> None:
        """Tag this run with the MLflow id of journal ``other``'s run (known once it is sent)."""
        self.append([log_record(links={tag: other})])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """``path`` as an artifact (a copy in the journal until the server has it)."""
        rel = self.journal.copy_artifact(path)
        self.append([artifact_record(rel, artifact_path)])

    def learning_curve(self, path: Path) -> Path | None:
        """The run's learning curve drawn into ``path`` (``tracking.curve``); None: no loss."""
        return learning_curve(self.journal, path)

    @contextlib.contextmanager
    def relay(self) -> Iterator[RelaySink]:
        """Where a training's ranks log into the run: a relay on this (the driver's) Ray node
        that appends to its journal; ended, its records written, with the block."""
        sink = start_relay(self.journal.folder)
        try:
            yield sink
        finally:
            stop_relay(sink)
            self.session.sender.wake()

    def drain(self) -> bool:
        """Wait (``drain_seconds`` at most, not while the server does not answer) for the
        server to have the run's records so far; whether it has."""
        sender = self.session.sender
        return sender.flush([self.journal], sender.options.drain_seconds)

    def delivered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds, the server down or not, for the server to have the
        run's records so far; whether it has."""
        return self.session.sender.flush([self.journal], timeout, while_down=True)

    def end(self, status: str = "FINISHED") -> None:
        self.append([status_record(status)])


def current() -> Run | None:
    """The run of the code running in this context (``running``), if any."""
    return _current.get()


def open_run(
    target: Target,
    name: str,
    tags: Mapping[str, str],
    *,
    parent: str | None = None,
    key: str | None = None,
) -> Run:
    """A new run (or ``key``'s again: a resumed training), under journal ``parent``'s run, in
    the session open in this context, or in a new one the run owns."""
    session = _session.get()
    owns = session is None
    if session is None:
        session = Session(target.options)
    journal = session.journal(target, key)
    # A local tracking store keeps artifacts beside the database, not in ./mlruns of whatever
    # directory the command ran in; a server decides for itself.
    location = (target.root / "mlartifacts").as_uri() if target.uri.startswith("sqlite:") else None
    run = Run(journal, target, session, owns)
    # Its owner: the runs of a process killed outright are ended by the next command.
    owner = this_process().fields()
    opening = open_record(
        target.experiment, name, tags, parent=parent, artifact_location=location, owner=owner
    )
    run.append([opening])
    return run


@contextlib.contextmanager
def running(run: Run, outermost: bool) -> Iterator[Run]:
    """``run`` as the current run; ended FINISHED, or FAILED by an error; at the end of the
    ``outermost`` run of a command (or of one that opened its session), the journals reach the
    server (``Session.finish``), and the session it opened closes."""
    token = _current.set(run)
    opened = _session.set(run.session) if run.owns_session else None
    error: BaseException | None = None
    try:
        yield run
    except BaseException as exc:
        error = exc
        run.end("FAILED")
        raise
    else:
        run.end("FINISHED")
    finally:
        _current.reset(token)
        if opened is not None:
            _session.reset(opened)
        if outermost or run.owns_session:  # Ctrl-C: nothing waited for
            wait = error is None or isinstance(error, Exception)
            left = run.session.finish(run.target, wait=wait)
            if run.owns_session:
                run.session.close(wait=wait and not left)
