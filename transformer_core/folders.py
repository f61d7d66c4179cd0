"""Output folders that never look complete before they are: written as a temporary sibling
``.<name>.tmp-<pid>-<id>`` and renamed into place, with what a killed writer left removed later.

Here, in the model library, because it travels with a registered model (its CTranslate2 and
Marian exports write folders too) as well as serving the pipeline's stages.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

log = logging.getLogger(__name__)


def temporary_sibling(out: Path) -> Path:
    """A fresh name beside ``out`` that ``remove_stale_temporaries`` recognises as this process's."""
    return out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def publish(tmp: Path, out: Path) -> None:
    """Move a finished temporary folder into place, replacing any older output."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
