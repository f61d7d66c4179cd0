"""The fingerprints of every stage upstream of some input folders, from their manifests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tasks.framework.config import fingerprint
from tasks.framework.manifest import read_manifest


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
