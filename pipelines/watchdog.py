"""A watchdog that outlives ``tfm``: when the command's process dies, even by SIGKILL, the
processes it started (the local Ray, Prefect's temporary API server, training workers) end too.

Ray and Prefect start their servers as child processes and nothing ties their lives to the
command's: after a kill they kept running (and training) for good. The watchdog is a small
process of its own session that notes the command's descendants every second and, once the
command is gone, terminates those still running (then kills what has not ended after a grace
period). Processes are remembered with their start time, so a reused PID is never touched.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

INTERVAL = 0.5
"""Seconds between looks at the command's process tree (its end is seen at once)."""
GRACE = 2.0
"""Seconds a process gets to end after SIGTERM before SIGKILL: a stopped command's Ray and
Prefect processes are gone within about that long after it exits."""


def start(pid: int | None = None) -> subprocess.Popen:
    """Watch process ``pid`` (this one by default) from a new, detached process."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.watchdog", str(pid or os.getpid())],
        start_new_session=True,  # a Ctrl-C or SIGTERM to the command's group spares it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def end(processes: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM ``processes``, SIGKILL those still running ``grace`` seconds later; returns the
    ones that were running. (The command itself must not do this before it exits: a driver
    whose raylet dies aborts with SIGABRT, losing its exit code and its one line.)"""
    # is_running() compares start times: a PID that now names another process is left alone.
    left = [p for p in processes if p.is_running()]
    for process in left:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, stubborn = psutil.wait_procs(left, timeout=grace)
    for process in stubborn:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(stubborn, timeout=grace)
    return left


def watch(pid: int, interval: float = INTERVAL, grace: float = GRACE) -> list[psutil.Process]:
    """Until process ``pid`` ends, note its descendants; then end those still running. Returns
    the processes it had to end."""
    try:
        command = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    while True:
        try:
            for child in command.children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child)
            command.wait(timeout=interval)  # returns as soon as the command has ended
        except psutil.TimeoutExpired:
            continue
        except psutil.NoSuchProcess:
            pass
        break
    return end(list(seen.values()), grace)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    watch(int(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
