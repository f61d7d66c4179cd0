"""The stage contract: one output folder per stage, a manifest, fingerprints, atomic writes.

A stage module has ``stage_config(config) -> dict`` (what it fingerprints besides its inputs)
and ``build(ctx: BuildContext) -> stats`` (writes its output into ``ctx.tmp``); the one runner
(``tasks.framework.runner``) does the rest. It writes into a temporary sibling folder;
``manifest.json`` is written last and the folder is then renamed into place, so a crash never
leaves a folder that looks complete. A stage whose folder holds a manifest with the same
fingerprint, and whose files are all there with the recorded sizes, is up to date and is
skipped. The runner logs each ``StageResult`` to MLflow once
(``tasks.framework.tracking.log_stage_result``); only train (its workers' curves) and register
(the model) log on their own, through ``tasks.framework.tracking`` too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from corpora.redact import redacted
from corpora.storage import StoredFolder
from tasks.framework.code_fingerprint import stage_code
from tasks.framework.config import RunConfig, fingerprint, flatten, to_dict
from transformer_core.folders import (
    sha256_file,
    write_json_atomic,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class StageError(RuntimeError):
    """A stage cannot run: a missing input, bad data, a failed download. The message says why."""


def code_version() -> str:
    """The installed project version (part of every stage fingerprint)."""
    try:
        return metadata.version("attention-pipeline")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None if it has none (or an unreadable one)."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def input_fingerprint(folder: Path, name: str) -> str:
    """The fingerprint of a finished input folder, after ``damage`` found nothing wrong with it;
    a clear error if it is missing, unfinished or damaged."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise StageError(
            f"input {name!r} is missing: {folder} has no {MANIFEST} (run `tfm stage {name}` first)"
        )
    problem = damage(Path(folder), manifest)
    if problem is not None:
        stage = manifest.get("stage", name)
        raise StageError(
            f"input {name!r} in {folder} is damaged: {problem} "
            f"(rebuild it: `tfm stage {stage} --config <config> --force`)"
        )
    return manifest["fingerprint"]


def input_fingerprints(inputs: Mapping[str, Path]) -> dict[str, str]:
    """``input_fingerprint`` of every input folder, by name."""
    return {name: input_fingerprint(Path(path), name) for name, path in inputs.items()}


SMALL_FILE = 1 << 20
"""Files up to this size are checked by sha256 whenever their folder is checked; larger ones by
size (and Parquet files by their footer) unless a full check is asked for."""


def damage(folder: Path, manifest: Mapping[str, Any], *, full: bool = False) -> str | None:
    """What is wrong with a finished folder's files against its manifest, or None: a missing
    file, another size, a Parquet or Arrow IPC file whose footer does not read or holds another
    row count, a sha256 that differs (files
    up to ``SMALL_FILE``; every file with ``full``)."""
    for rel, info in manifest.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != info["bytes"]:
            return f"{rel} has {size} bytes, manifest says {info['bytes']}"
        if path.suffix in TABLE_FILES:
            rows = table_rows(path)
            if rows is None:
                kind = TABLE_FILES[path.suffix]
                return f"{rel} is not a readable {kind} file (its footer does not read)"
            if rows != info.get("rows", rows):
                return f"{rel} holds {rows} rows, manifest says {info['rows']}"
        if (
            "sha256" in info
            and (full or size <= SMALL_FILE)
            and sha256_file(path) != info["sha256"]
        ):
            return f"{rel} differs from the sha256 in {MANIFEST}"
    return None


def parquet_rows(path: Path) -> int | None:
    """The row count in a Parquet file's footer; None if the footer does not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError):
        return None


TABLE_FILES = {".parquet": "Parquet", ".arrow": "Arrow IPC"}
"""Files whose row count the manifest records and ``damage`` checks, by suffix."""


def table_rows(path: Path) -> int | None:
    """The row count of a Parquet or Arrow IPC file, from its footer (and an IPC file's batch
    headers); None if it does not read."""
    if path.suffix != ".arrow":
        return parquet_rows(path)
    import pyarrow as pa
    import pyarrow.ipc

    try:
        with pa.memory_map(str(path)) as source:
            reader = pyarrow.ipc.open_file(source)
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (pa.ArrowException, OSError):
        return None


StageCode = Mapping[str, str] | str
"""The code a fingerprint hashes: a digest per source file, or (train's resume key) a version."""


def stage_identity(
    stage: str, config: Mapping[str, Any], inputs: Mapping[str, str], code: StageCode | None = None
) -> dict[str, Any]:
    """What a stage's fingerprint hashes: its name, its config, its inputs' fingerprints and its
    code (``code_fingerprint.stage_code``: a digest per source file it runs, unless given).

    The config with URI passwords masked (``redacted``), as its manifest records it: a manifest
    travels (an MLflow artifact, a copied folder) and a password does not change what a stage
    makes; a config without one hashes as it always did."""
    return {
        "stage": stage,
        "config": redacted(to_dict(config)),
        "inputs": dict(inputs),
        "code": stage_code(stage) if code is None else code,
    }


def stage_fingerprint(
    stage: str, config: Mapping[str, Any], inputs: Mapping[str, str], code: StageCode | None = None
) -> str:
    """hash(stage, config, input fingerprints, code): ``stage_identity``'s hash."""
    return fingerprint(stage_identity(stage, config, inputs, code))


def why_changed(manifest: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    """What differs between the identity a folder was written (or last accepted) for and
    ``identity``, in a few words: ``config changed (train.steps)``, ``input changed (clean)``,
    ``code changed (corpora/filters.py)``."""
    was = (manifest.get("accepted") or [manifest])[-1]
    recorded_inputs = {
        role: (info["fingerprint"] if isinstance(info, Mapping) else info)
        for role, info in (was.get("inputs") or {}).items()
    }
    reasons = []
    old, new = flatten(was.get("config") or {}), flatten(identity["config"])
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if keys:
        reasons.append(f"config changed ({_some(keys)})")
    roles = sorted(
        r
        for r in recorded_inputs.keys() | identity["inputs"].keys()
        if recorded_inputs.get(r) != identity["inputs"].get(r)
    )
    if roles:
        reasons.append(f"input changed ({_some(roles)})")
    if "code" not in was:
        reasons.append("code changed (written before per-file code fingerprints)")
    else:
        code, current = was["code"], identity["code"]
        files = sorted(f for f in code.keys() | current.keys() if code.get(f) != current.get(f))
        if files:
            reasons.append(f"code changed ({_some(files)})")
    return "; ".join(reasons) or "fingerprint differs"


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


@dataclass(frozen=True)
class BuildContext:
    """What a stage's ``build`` is given: the run config, its input folders by role, their
    fingerprints (checked by the runner: missing or damaged inputs never reach a build), and
    the temporary folder it writes its output into."""

    config: RunConfig
    inputs: Mapping[str, Path]
    input_fps: Mapping[str, str]
    tmp: Path
    stored: Mapping[str, StoredFolder] = field(default_factory=dict)
    """Input role -> its folder on the object store, when the work dir is on one (``inputs``
    are then this node's copies): what a Ray worker on another node is handed to copy."""


@dataclass(frozen=True)
class StageResult:
    """What running a stage did: where its output is, whether it ran and why, its stats."""

    stage: str
    """Stage name."""
    path: Path
    """The stage's output folder."""
    ran: bool
    """True if it ran now; False if its output was up to date and it was skipped."""
    reason: str
    """Why it ran (forced, missing, what changed) or why it was skipped."""
    stats: dict[str, Any]
    """The manifest's stats (also when skipped)."""
    seconds: float
    """Time spent in this call (checking only, when skipped)."""


@dataclass(frozen=True)
class Status:
    """Where a stage's output folder stands."""

    state: str
    """'up to date', 'stale' or 'missing'."""
    reason: str
    """Why, in a few words."""

    @property
    def up_to_date(self) -> bool:
        return self.state == "up to date"


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


def describe_files(folder: Path, hash_files: bool = True) -> dict[str, dict[str, Any]]:
    """Size, sha256 and, for Parquet and Arrow IPC files, the row count of every file under
    ``folder`` except the manifest, by relative path."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            info: dict[str, Any] = {"bytes": path.stat().st_size}
            if hash_files:
                info["sha256"] = sha256_file(path)
            if path.suffix in TABLE_FILES:
                info["rows"] = table_rows(path)
            files[path.relative_to(folder).as_posix()] = info
    return files


def lineage(inputs: Mapping[str, Path], key: str = "fingerprint") -> dict[str, str]:
    """Fingerprint of every upstream stage, found by following the manifests' ``inputs`` chains;
    with ``key="code"``, the fingerprint of each one's code (``stage_code``) instead.

    Keys are stage names (``download``, ``clean``, ``tokenizer``, ``shard``, ``train``, ...);
    a folder that no longer exists is named by its role, with the fingerprint its reader recorded
    (its code fingerprint is then unknown and left out).
    """
    found: dict[str, str] = {}
    seen: set[str] = set()
    stack: list[tuple[str, Path, str | None]] = [
        (role, Path(p), None) for role, p in inputs.items()
    ]
    while stack:
        role, path, recorded = stack.pop()
        resolved = str(path.resolve())
        if resolved in seen:
            continue
        seen.add(resolved)
        manifest = read_manifest(path)
        if manifest is None:
            if recorded and key == "fingerprint":
                found.setdefault(role, recorded)
            continue
        if key == "fingerprint":
            found.setdefault(manifest.get("stage", role), manifest["fingerprint"])
        elif "code" in manifest:
            found.setdefault(manifest.get("stage", role), fingerprint(manifest["code"]))
        for up_role, info in (manifest.get("inputs") or {}).items():
            stack.append((up_role, Path(info["path"]), info.get("fingerprint")))
    return dict(sorted(found.items()))
