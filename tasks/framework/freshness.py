"""Whether a stage folder is up to date for an identity, and accepting a stale one as such."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tasks.framework.config import fingerprint
from tasks.framework.damage import damage
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.results import StageError, StageResult, Status
from tasks.framework.stage_fingerprint import code_version, why_changed
from transformer_core.folders import write_json_atomic

log = logging.getLogger(__name__)


def check(folder: Path, identity: Mapping[str, Any], *, full: bool = False) -> Status:
    """Is ``folder`` a complete, undamaged output (``damage``) written, or accepted, for this
    identity (``stage_identity``)? If not, why."""
    folder = Path(folder)
    if not folder.exists():
        return Status("missing", f"{folder} does not exist")
    manifest = read_manifest(folder)
    if manifest is None:
        return Status("stale", f"{folder} has no readable {MANIFEST}")
    return judge(manifest, identity, lambda: damage(folder, manifest, full=full))


def judge(
    manifest: Mapping[str, Any], identity: Mapping[str, Any], problem: Callable[[], str | None]
) -> Status:
    """A folder with this manifest is up to date for ``identity`` if it was written or accepted
    for it and ``problem()`` (what is wrong with its files, asked only then) finds nothing."""
    expected = fingerprint(identity)
    accepted = {a.get("fingerprint") for a in manifest.get("accepted") or ()}
    if expected != manifest.get("fingerprint") and expected not in accepted:
        return Status("stale", why_changed(manifest, identity))
    found = problem()
    if found is not None:
        return Status("stale", found)
    how = "accepted" if expected != manifest.get("fingerprint") else "matches"
    return Status("up to date", f"fingerprint {expected[:12]} {how}")


def freshness(
    folder: Path,
    identity: Mapping[str, Any],
    *,
    outdated: Callable[[Path], str | None] | None = None,
    full: bool = False,
) -> Status:
    """Whether ``folder`` is up to date for ``identity`` (``check``), which ``outdated(folder)``
    can overrule for a reason outside the folder (a registry version that is gone). What
    ``run_stage`` skips on and ``tfm status`` shows: one decision."""
    status = check(folder, identity, full=full)
    if status.up_to_date and outdated is not None and (why := outdated(folder)) is not None:
        return Status("stale", why)
    return status


def accept(stage: str, out_dir: Path, current: Callable[[], Mapping[str, Any]]) -> StageResult:
    """Keep ``out_dir`` as the output for the current config, inputs and code, without running
    the stage: its manifest records the acceptance (when, what had changed, the fingerprint it
    now stands for) beside the fingerprint it was written with, which stays its identity for the
    stages that read it. Its files must be intact. ``current()``: the stage's identity now
    (``runner.identity``), asked once the folder is found intact."""
    started = time.time()
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    if manifest is None:
        raise StageError(f"{out_dir} holds no finished output to accept (no {MANIFEST})")
    problem = damage(out_dir, manifest, full=True)
    if problem is not None:
        raise StageError(f"{out_dir} cannot be accepted: {problem}; rerun the stage instead")
    identity = dict(current())
    status = check(out_dir, identity)
    if status.up_to_date:
        return StageResult(
            stage, out_dir, False, status.reason, manifest.get("stats", {}), time.time() - started
        )
    write_json_atomic(out_dir / MANIFEST, accepted(manifest, identity, status.reason, started))
    log.info("stage %s: accepted as up to date (%s) -> %s", stage, status.reason, out_dir)
    return StageResult(
        stage,
        out_dir,
        False,
        f"accepted: {status.reason}",
        manifest.get("stats", {}),
        time.time() - started,
    )


def accepted(
    manifest: Mapping[str, Any], identity: Mapping[str, Any], changed: str, when: float
) -> dict[str, Any]:
    """``manifest`` with the acceptance of ``identity`` recorded (``accept``)."""
    entry = {
        **identity,
        "fingerprint": fingerprint(identity),
        "time": when,
        "changed": changed,
        "code_version": code_version(),
    }
    return {**manifest, "accepted": [*(manifest.get("accepted") or []), entry]}
