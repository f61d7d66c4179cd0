"""The fingerprints of every stage upstream of some input folders, from their manifests, and the
registered models a model came from (a distilled model's teacher, a fine-tuned model's parent)."""

from __future__ import annotations

import json
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


def teacher_tags(inputs: Mapping[str, Path]) -> dict[str, str]:
    """A distilled model's teacher (the distill pipeline's ``teacher`` input, its
    ``teacher.json``) as tags: ``teacher.name``, ``teacher.version``, ``teacher.model_uri``,
    ``teacher.found_by``, ``teacher.weights_sha256``; none for a model trained on references."""
    if "teacher" not in inputs:
        return {}
    record = json.loads((inputs["teacher"] / "teacher.json").read_text(encoding="utf-8"))
    tags = {f"teacher.{k}": str(record[k]) for k in ("name", "version", "found_by")}
    tags["teacher.model_uri"] = f"models:/{record['name']}/{record['version']}"
    tags["teacher.weights_sha256"] = str(record["weights_sha256"])
    return tags


def parent_tags(inputs: Mapping[str, Path]) -> dict[str, str]:
    """A fine-tuned model's parent (the parent stage's folder, read as the ``tokenizer`` input,
    its ``parent.json``) as tags: ``parent.name``, ``parent.version`` (0: a work dir's folder,
    named by its path), ``parent.found_by``, ``parent.weights_sha256``; none for a model trained
    from random weights."""
    record_file = inputs["tokenizer"] / "parent.json"
    if not record_file.is_file():
        return {}
    record = json.loads(record_file.read_text(encoding="utf-8"))
    return {
        f"parent.{k}": str(record[k]) for k in ("name", "version", "found_by", "weights_sha256")
    }
