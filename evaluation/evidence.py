"""What a registered version keeps of its evaluation: each test set's hypotheses (the evidence a
later candidate is compared with, without translating again) and its figures as registry tags.

A version's evidence is a folder, logged with its registration run (``EVIDENCE_PATH``):
``sets.json`` (each set's name, segments, the sha256 of its references, its hypothesis file)
and one ``<set>.hyp`` file per set, a hypothesis a line. Two systems are compared on a set only
when the references' digests are the same: the same set, as read and normalised.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EVIDENCE_PATH",
    "TAGGED",
    "TAG_PREFIX",
    "SetOutputs",
    "figure_tags",
    "read_evidence",
    "tag_name",
    "write_evidence",
]

EVIDENCE_PATH = "evidence"
"""The artifact folder of a registration run that holds the version's hypotheses."""
INDEX = "sets.json"
TAG_PREFIX = "eval"
"""A version's figure tags: ``eval.<set>.<metric>`` (``TAGGED``), ``eval.<set>.segments`` and
``eval.<set>.signature`` (bleu_sacre's)."""
TAGGED = ("bleu_sacre", "bleu_tok_compound", "bleu_tok_lc", "chrf")


@dataclass(frozen=True)
class SetOutputs:
    """One test set's references and a system's hypotheses, line by line."""

    name: str
    refs: list[str]
    hyps: list[str]

    def __post_init__(self) -> None:
        if len(self.refs) != len(self.hyps):
            raise ValueError(
                f"test set {self.name!r}: {len(self.hyps)} hypotheses of {len(self.refs)} "
                "references"
            )

    @property
    def refs_sha256(self) -> str:
        """The references' digest: two systems are compared only on the same references."""
        return digest(self.refs)


def digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


def tag_name(name: str) -> str:
    """A set's name as MLflow takes it in a tag key or a file name (letters, digits, ``_-.``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def write_evidence(folder: Path, sets: Sequence[SetOutputs]) -> Path:
    """``folder`` holding ``sets``' hypotheses and their index; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    index = []
    for s in sets:
        file = f"{tag_name(s.name)}.hyp"
        (folder / file).write_text("".join(h + "\n" for h in s.hyps), encoding="utf-8")
        index.append(
            {"name": s.name, "segments": len(s.refs), "refs_sha256": s.refs_sha256, "file": file}
        )
    (folder / INDEX).write_text(json.dumps({"sets": index}, indent=2) + "\n", encoding="utf-8")
    return folder


def read_evidence(folder: Path) -> dict[str, tuple[str, list[str]]]:
    """Set name -> (its references' sha256, the hypotheses) of an evidence folder; a set whose
    file does not hold one line per segment is left out (it cannot be compared)."""
    index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    found = {}
    for entry in index["sets"]:
        path = folder / Path(entry["file"]).name  # a name, never a path out of the folder
        if not path.is_file():
            continue
        hyps = path.read_text(encoding="utf-8").split("\n")[:-1]
        if len(hyps) == int(entry["segments"]):
            found[str(entry["name"])] = (str(entry["refs_sha256"]), hyps)
    return found


def figure_tags(figures: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each set's figures (set name -> ``evaluation.bleu.score_texts``' keys, ``segments``) as
    registry tags, set names made tag-safe."""
    tags = {}
    for name, scores in figures.items():
        key = f"{TAG_PREFIX}.{tag_name(name)}"
        tags.update({f"{key}.{m}": f"{float(scores[m]):.4f}" for m in TAGGED})
        tags[f"{key}.segments"] = str(scores["segments"])
        tags[f"{key}.signature"] = str(scores["bleu_sacre_signature"])
    return tags
