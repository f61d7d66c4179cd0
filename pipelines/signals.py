"""How a command ends when it is stopped: Ctrl-C or SIGTERM end ``tfm run`` / ``tfm stage`` in
seconds, in one line, with 130 or 143; a rerun of the same command continues."""

from __future__ import annotations

import os
import sys
import threading

STOP_GRACE = 8.0
"""Seconds a stopped command gets to end by itself before it exits regardless
(``stop_on_signals``)."""
_stopped = threading.Event()
_stopped_by: list[int] = []
_prog = "tfm"


def stop_on_signals(prog: str) -> None:
    """Ctrl-C (SIGINT, which a terminal sends to the whole process group) and SIGTERM end the
    command within seconds, in one line, with 130 or 143.

    Each interrupts the main thread (KeyboardInterrupt, or whatever handler a library installed
    meanwhile: Ray Train's aborts the training run, Ray's exits on SIGTERM), so a stage ends as
    on any error, training keeping its checkpoints. The same Ctrl-C also ends Prefect's temporary
    API server, and the flow's exit then waited minutes on it before failing with a
    ConnectError: ``STOP_GRACE`` seconds after the signal the command exits regardless, and the
    watchdog ends what it started (the local Ray, the server). The signal is seen through
    Python's wakeup fd, which every Python-level handler writes to, so a library that replaces
    the handler does not hide it."""
    import signal
    import socket

    take_back()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    global _prog
    _prog = prog
    threading.Thread(target=_watch_signals, args=(reader, writer), daemon=True).start()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def take_back() -> None:
    """Ctrl-C and SIGTERM interrupt the main thread again (``stop_on_signals``), after a library
    took them: ``ray.init`` in the main thread installs a handler that exits, and Ray's core a
    native one that prints a stack and kills the process (a command that runs until it is
    stopped, ``tfm serve``, would end without its cleanup)."""
    import signal

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


def _watch_signals(reader: object, writer: object) -> None:
    """Note the first SIGINT or SIGTERM and exit ``STOP_GRACE`` seconds later (``writer``
    is held here so that it stays open)."""
    import signal

    while True:
        for signum in reader.recv(64):  # type: ignore[attr-defined]
            if signum in (signal.SIGINT, signal.SIGTERM) and not _stopped_by:
                _stopped_by.append(signum)
                _stopped.set()
                exit_later = threading.Timer(STOP_GRACE, exit_now, args=(signum,))
                exit_later.daemon = True
                exit_later.start()


def stop_line(signum: int) -> str:
    import signal

    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return f"{_prog}: {what}; rerun the same command to continue"


def exit_now(signum: int) -> None:
    """The stop's one line, then exit at once: no interpreter shutdown, in which Ray's core
    library aborted the process (SIGABRT, a native stack dump) after a SIGTERM."""
    sys.stdout.flush()
    print(stop_line(signum), file=sys.stderr, flush=True)
    os._exit(128 + signum)


def stop_signal(wait: float = 0.5) -> int | None:
    """The signal that stopped the command, if one did (the watcher may note it a moment after
    the main thread has felt it)."""
    return _stopped_by[0] if _stopped.wait(wait) else None
