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
import time

import psutil

INTERVAL = 1.0
"""Seconds between looks at the command's process tree."""
GRACE = 5.0
"""Seconds a process gets to end after SIGTERM before SIGKILL."""


def start(pid: int | None = None) -> subprocess.Popen:
    """Watch process ``pid`` (this one by default) from a new, detached process."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.watchdog", str(pid or os.getpid())],
        start_new_session=True,  # a Ctrl-C or SIGTERM to the command's group spares it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def watch(pid: int, interval: float = INTERVAL, grace: float = GRACE) -> list[psutil.Process]:
    """Until process ``pid`` ends, note its descendants; then end those still running. Returns
    the processes it had to end."""
    try:
        command = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    while command.is_running():
        try:
            for child in command.children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    # is_running() compares start times: a PID that now names another process is left alone.
    left = [p for p in seen.values() if p.is_running()]
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
    return left


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    watch(int(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
