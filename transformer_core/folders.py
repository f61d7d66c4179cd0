"""Output folders that never look complete before they are: written as a temporary sibling
``.<name>.tmp-<pid>-<id>`` and renamed into place, with what a killed writer left removed later;
and the sha256 every artifact's identity is made of.

Here, in the model library, because it travels with a registered model (its CTranslate2 and
Marian exports write folders too) as well as serving the pipeline's stages.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def temporary_sibling(out: Path) -> Path:
    """A fresh name beside ``out`` that ``remove_stale_temporaries`` recognises as this
    process's."""
    return out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def publish(tmp: Path, out: Path, *, already: Callable[[Path], bool] | None = None) -> None:
    """Move a finished temporary folder into place, replacing any older output (never a file).

    ``already(out)`` says whether ``out`` holds this very output, finished meanwhile by another
    process (two exports of one checkpoint): that one is kept and ``tmp`` is left to the caller."""
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder: not replacing it")
    if already is not None and already(out):
        return
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        if already is None or not already(out):  # someone else's output, not this one: keep it
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:  # Any: a JSON value
    """Write JSON to ``path`` through a temporary file and a rename: never half a file, also
    with several processes writing it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_identity(path: Path) -> str:
    """The sha256 of a file a config names, once per process while it is unchanged (its size
    and modification time); "" for no file (the stage that reads it says so)."""
    path = Path(path)
    if not path.is_file():
        return ""
    stat = path.stat()
    return _hashed(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _hashed(path: Path, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Remove the temporary siblings of ``out`` (``.<name>.tmp-<pid>-*``, ``.<name>.old-*``)
    that a killed writer left behind: those whose process is gone. Returns what it removed."""
    removed = []
    for path in out.parent.glob(f".{out.name}.*-*"):
        kind, _, rest = path.name[len(out.name) + 2 :].partition("-")
        pid = rest.split("-", 1)[0]
        owner_alive = kind == "tmp" and pid.isdigit() and _alive(int(pid))
        if kind in ("tmp", "old") and not owner_alive:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s, left behind by a run that did not finish", path)
            removed.append(path)
    return removed


def fresh_temporary(out: Path) -> Path:
    """A new, empty temporary sibling of ``out`` to build it in (parents made), what killed
    writers left beside ``out`` removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = temporary_sibling(out)
    tmp.mkdir()
    return tmp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
