"""``serve.ingress: haproxy``: HAProxy in front of replicas that answer HTTP themselves, in place
of Ray Serve's Python proxy, which on 2 cores took half a core at 145 requests/s and made each
replica fetch a request's body from it with a second Ray call (docs/serving.md).

Ray Serve 2.60 has this ingress behind environment variables that its processes read as they
start (``RAY_SERVE_ENABLE_DIRECT_INGRESS``, ``RAY_SERVE_ENABLE_HA_PROXY``), so ``tfm serve`` sets
them for a local Ray only, before it starts (``environment``). The HAProxy config it renders
binds a stats page and a Prometheus frontend on every interface at fixed ports, and opens its
admin socket to every local user: Ray Serve runs HAProxy through ``tfm-haproxy`` (``main``),
which puts those binds on 127.0.0.1 at the free ports chosen here and the socket at mode 600,
then becomes HAProxy (the same PID, which Ray Serve checks). Standard library only: it runs on
each HAProxy start and reload."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import sys
from pathlib import Path

__all__ = ["choose", "environment", "main", "rewrite"]

REAL = "TFM_HAPROXY_BINARY"
"""The environment variable naming the real haproxy binary for ``tfm-haproxy``."""
_OPEN_BIND = re.compile(r"^([ \t]*bind[ \t]+)(?:\*|0\.0\.0\.0)?:(\d+)[ \t]*$", re.MULTILINE)
_OPEN_SOCKET = re.compile(r"^(\s*stats socket \S+ mode )666\b", re.MULTILINE)


def wrapper() -> Path:
    """The ``tfm-haproxy`` script beside this Python (the package's console script)."""
    return Path(sys.executable).with_name("tfm-haproxy")


def choose(ingress: str, local: bool) -> str:
    """``haproxy`` or ``proxy``: what ``serve.ingress`` (auto, haproxy, proxy) comes to on this
    machine; a ConfigError where haproxy is asked for and cannot run."""
    from transformer_core.config_checks import ConfigError

    if ingress == "proxy":
        return "proxy"
    binary, script = shutil.which("haproxy"), wrapper().is_file()
    if ingress == "auto":
        return "haproxy" if local and binary and script else "proxy"
    if not local:
        raise ConfigError(
            "serve.ingress",
            "haproxy is set up by tfm serve for a local Ray only; on a cluster, start each "
            "node's Ray with RAY_SERVE_ENABLE_DIRECT_INGRESS=1 and RAY_SERVE_ENABLE_HA_PROXY=1 "
            "(docs/serving.md) and leave serve.ingress at auto",
        )
    if binary is None:
        raise ConfigError(
            "serve.ingress",
            "haproxy: no haproxy on PATH (Debian or Ubuntu: apt-get install haproxy), "
            "or set serve.ingress: proxy",
        )
    if not script:
        raise ConfigError(
            "serve.ingress",
            f"haproxy: {wrapper()} is missing; reinstall the project (pip install -e .)",
        )
    return "haproxy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    """The variables that turn HAProxy ingress on in a Ray started after they are set."""
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper()),
        REAL: shutil.which("haproxy") or "haproxy",
        # Free ports for its stats page and Prometheus frontend (8404 and 9101 would be
        # taken by a second tfm serve on the machine); tfm-haproxy binds them to loopback.
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
    }


def rewrite(config: str) -> str:
    """``config`` with every bind on all interfaces put on 127.0.0.1 and the admin socket
    readable by its owner only."""
    config = _OPEN_BIND.sub(r"\g<1>127.0.0.1:\g<2>", config)
    return _OPEN_SOCKET.sub(r"\g<1>600", config)


def main(argv: list[str] | None = None) -> None:
    """``tfm-haproxy ARGS``: HAProxy with ARGS, its ``-f`` config rewritten in place first
    (under the lock Ray Serve writes it under)."""
    args = list(sys.argv[1:] if argv is None else argv)
    real = os.environ.get(REAL) or shutil.which("haproxy")
    if not real:
        sys.exit("tfm-haproxy: no haproxy binary (TFM_HAPROXY_BINARY or PATH)")
    if "-f" in args:
        config = Path(args[args.index("-f") + 1])
        with open(f"{config}.lock", "w") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            text = config.read_text()
            fixed = rewrite(text)
            if fixed != text:
                config.write_text(fixed)
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main()
