"""``uv pip ARGS`` with the package sources pip is configured with (``make venv``).

uv installs the environment in seconds where pip takes minutes, but it reads none of pip's
configuration; this passes pip's (``pip config list``: files and ``PIP_*`` variables) to it, so
that a mirror, a local wheel folder or a constraints file set up for pip applies to uv too, with
pip's rule of the best version across every index. Usage: ``python .ci/uv_pip.py install ...``
with the venv's Python, once uv is installed in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LISTS = {  # pip's option: uv's, for each of its whitespace-separated values
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}  # pip's: a variable over any file


def pip_settings(listing: str) -> dict[str, str]:
    """``pip config list``'s lines (``section.key='value'``), each key's value by pip's order."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if not sep or section not in PRECEDENCE:
            continue
        rank = PRECEDENCE[section]
        if key not in chosen or rank >= chosen[key][0]:
            chosen[key] = (rank, value.strip().strip("'\""))
    return {key: value for key, (_, value) in chosen.items()}


def uv_options(
    settings: dict[str, str], given_index: bool = False
) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment variables for pip's ``settings`` (``given_index``: the
    command names its own ``--index-url``, which then replaces pip's, as it would for pip)."""
    # pip's defaults: the best version across every index, and modules compiled at install
    # (without it, under PYTHONDONTWRITEBYTECODE every process compiles what it imports anew).
    options = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    env: dict[str, str] = {}
    if settings.get("index-url") and not given_index:
        options += ["--index-url", settings["index-url"]]
    for key, flag in LISTS.items():
        for value in settings.get(key, "").split():
            options += [flag, value]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    timeout = settings.get("timeout") or settings.get("default-timeout")
    if timeout:
        env["UV_HTTP_TIMEOUT"] = timeout
    return options, env


def main(argv: list[str]) -> int:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    command, rest = argv[:1], argv[1:]
    options, env = uv_options(pip_settings(listing), given_index="--index-url" in rest)
    uv = Path(sys.executable).with_name("uv")
    return subprocess.call(
        [str(uv), "pip", *command, "--python", sys.executable, *options, *rest],
        env={**os.environ, **env},
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
