"""How ``benchmarks/peers`` runs its commands: one process or a training's ranks at once, each
with its output in a log; our side's scripts and their JSON result; a toolkit's failure as one
line (``guarded``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .env import last_line

HERE = Path(__file__).resolve().parent


def run(
    cmd: list[str], env: dict[str, str] | None, log: Path, cwd: Path | None = None
) -> tuple[int, str, float]:
    """``cmd`` with its output in ``log``; exit code, output and wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seconds = time.perf_counter() - started
    log.write_text(" ".join(cmd) + "\n\n" + done.stdout, encoding="utf-8")
    return done.returncode, done.stdout, seconds


def run_ranks(cmds: list[list[str]], env: dict[str, str], log: Path) -> tuple[int, str, float]:
    """The ranks of one training at once (``run`` for one): the first nonzero exit code, rank
    0's output (in ``log``; the others' beside it) and the wall seconds until the last ends."""
    if len(cmds) == 1:
        return run(cmds[0], env, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    logs = [log if i == 0 else log.with_suffix(f".rank{i}.log") for i in range(len(cmds))]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        sinks = [stack.enter_context(path.open("w", encoding="utf-8")) for path in logs]
        for sink, cmd in zip(sinks, cmds, strict=True):
            sink.write(" ".join(cmd) + "\n\n")
            sink.flush()
        ranks = [
            subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
            for cmd, sink in zip(cmds, sinks, strict=True)
        ]
        codes = [rank.wait() for rank in ranks]
    seconds = time.perf_counter() - started
    return next((c for c in codes if c), 0), log.read_text(encoding="utf-8"), seconds


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours_env(threads: int) -> dict[str, str]:
    """Our scripts' environment: the workers' allocator settings (``train.keep_freed_memory``)."""
    from training.allocator import KEEP_FREED_MEMORY

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads))
    env.update(KEEP_FREED_MEMORY)
    return env


def ours(what: str, args: list[str], threads: int, log: Path) -> dict[str, Any]:
    """``benchmarks/peers ours WHAT ...``'s JSON result; ``problem`` when it failed."""
    cmd = [sys.executable, str(HERE), "ours", what, *args]
    code, out, seconds = run(cmd, ours_env(threads), log)
    line = next((x for x in reversed(out.splitlines()) if x.startswith("PEERS-RESULT ")), None)
    if code != 0 or line is None:
        return {"problem": f"ours {what}: exit {code}: {last_line(out)} ({log})"}
    return json.loads(line.removeprefix("PEERS-RESULT ")) | {"wall_s": seconds}


def guarded(what: str, function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)``, or ``problem`` in one line when it raised (a log that did not hold
    what its parser looks for): one toolkit's failure leaves the others' rows."""
    try:
        return function(*args)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as err:
        return {"problem": f"{what}: {type(err).__name__}: {err}"[:300]}
