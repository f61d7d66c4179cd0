"""A stage's fingerprint: what it hashes (name, config, inputs' fingerprints, code), what
changed since a folder was written, and the fingerprint of an input folder."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from filesystem.redact import redacted
from tasks.framework.code_fingerprint import stage_code
from tasks.framework.config import fingerprint, flatten, to_dict
from tasks.framework.damage import damage
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.results import StageError


def code_version() -> str:
    """The installed project version (part of every stage fingerprint)."""
    try:
        return metadata.version("attention-pipeline")
    except metadata.PackageNotFoundError:
        return "0+unknown"


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


StageCode = Mapping[str, str] | str
"""The code a fingerprint hashes: a digest per definition the stage reaches, or (train's resume
key) a version."""


def stage_identity(
    stage: str, config: Mapping[str, Any], inputs: Mapping[str, str], code: StageCode | None = None
) -> dict[str, Any]:
    """What a stage's fingerprint hashes: its name, its config, its inputs' fingerprints and its
    code (``code_fingerprint.stage_code``: a digest per definition it reaches, unless given).

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
    ``code changed (keep_pair)`` (the definitions whose code differs)."""
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
    code, current = was.get("code"), identity["code"]
    if not isinstance(code, Mapping) or any(name.endswith(".py") for name in code):
        reasons.append("code changed (recorded before per-definition code fingerprints)")
    else:
        names = sorted(n for n in code.keys() | current.keys() if code.get(n) != current.get(n))
        if names:
            reasons.append(f"code changed ({_some(names)})")
    return "; ".join(reasons) or "fingerprint differs"


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
