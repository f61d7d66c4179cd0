"""The cluster's unprivileged users: made once, given the folders they write, and a virtual
environment they can run."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .hosts import sh
from .layout import BIN, ClusterError, Layout


def system_user(name: str) -> None:
    """A system user with no login and no home, made once (``useradd --system``)."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    done = sh(
        "useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
        "--shell", "/usr/sbin/nologin", name, check=False, quiet=True,
    )  # fmt: skip
    if done.returncode not in (0, 9):  # 9: another `up` made it meanwhile
        raise ClusterError(f"useradd {name} failed: {done.stderr.strip()}")


def owned_folder(path: Path, user: str, mode: int = 0o700) -> Path:
    """``path`` (made if missing) and everything in it owned by ``user``; the folder itself
    ``mode`` (by default closed to everyone else)."""
    entry = pwd.getpwnam(user)
    path.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)
    return path


def as_user(user: str, argv: list[str]) -> list[str]:
    """``argv`` run as ``user`` through a shell (setpriv's own exec would still find a path
    the user cannot reach)."""
    drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
    return [*drop, "/bin/sh", "-c", 'exec "$0" "$@"', *argv]


def runs_for(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(as_user(user, argv), capture_output=True, text=True, cwd="/")


def make_venv(layout: Layout, user: str) -> Path:
    """``<state>/venv``, made afresh: a virtual environment ``user`` (and every other user of
    the cluster) can run, whose site-packages is this one's and whose scripts run this one's.

    Its Python is this environment's own interpreter where ``user`` can reach it, else the
    system's of the same version: a venv made from a Python under root's 0700 home (pyenv's)
    runs for root only. Hand-written (``venv`` and a link): the scripts pip wrote name this
    environment's interpreter in their first line, so each gets a two-line wrapper."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    tries = [str(Path(sys.executable).resolve()), *([system] if system else [])]
    python = next((p for p in tries if runs_for(user, [p, "-c", "pass"]).returncode == 0), None)
    if python is None:
        raise ClusterError(
            f"{user} can run neither {tries[0]} nor a system {version}: install {version} "
            "where other users can run it"
        )
    venv = layout.venv
    sh(python, "-m", "venv", "--without-pip", "--clear", str(venv), quiet=True)
    packages = venv / "lib" / version / "site-packages"
    shutil.rmtree(packages)
    packages.symlink_to(sysconfig.get_paths()["purelib"])
    for script in sorted(BIN.iterdir()):
        target = venv / "bin" / script.name
        if script.is_symlink() or not script.is_file() or target.exists():
            continue  # the interpreter's links, which venv made anew
        with open(script, "rb") as f:
            head = f.read(256).split(b"\n")[:2]
        if head[0].startswith(b"#!") and any(b"python" in line for line in head):
            target.write_text(f'#!/bin/sh\nexec "{venv / "bin" / "python"}" "{script}" "$@"\n')
            target.chmod(0o755)
    # The project through the editable install's finder: the repository is readable to them.
    check = runs_for(user, [str(layout.python), "-c", "import pipelines"])
    if check.returncode != 0:
        said = (check.stderr.strip().splitlines() or ["?"])[-1]
        raise ClusterError(
            f"{user} cannot import the project with {layout.python} ({said}): put the "
            "repository and its virtual environment where other users can read them"
        )
    return venv
