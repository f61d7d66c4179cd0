"""A registered version's kept hypotheses (``evaluation.evidence``), read back from its
registration run, and a fine-tuned model compared on them with its registered parent."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation.champion import against_parent
from evaluation.evidence import EVIDENCE_PATH, SetOutputs, read_evidence
from filesystem.redact import redact_text
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig

log = logging.getLogger("tasks.register")


def stored_evidence(config: RunConfig, previous: Any) -> dict[str, tuple[str, list[str]]] | None:
    """A registered version's kept hypotheses (``evaluation.evidence.read_evidence``), or None
    where its registration run kept none."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if not previous.run_id:
        return None
    with tempfile.TemporaryDirectory(prefix="evidence-") as tmp:
        try:
            folder = mlflow.artifacts.download_artifacts(
                run_id=previous.run_id,
                artifact_path=EVIDENCE_PATH,
                dst_path=tmp,
                tracking_uri=config.tracking_uri,
            )
            return read_evidence(Path(folder))
        except (MlflowException, OSError, ValueError, KeyError) as exc:
            log.info(
                "register: no hypotheses of %s version %s read: %s",
                previous.name,
                previous.version,
                redact_text(str(exc).splitlines()[0][:200]) if str(exc) else type(exc).__name__,
            )
            return None


def compared_with_parent(
    config: RunConfig, inputs: Mapping[str, Path], evidence: Sequence[SetOutputs]
) -> list[dict[str, Any]]:
    """A fine-tuned model against its registered parent (``parent.json`` of the parent stage,
    read as the tokenizer input) on every set both were judged on with the same references
    (``evaluation.champion.against_parent``); none for another model, a work dir's folder as the
    parent, or a parent that kept no hypotheses."""
    from mlflow.exceptions import MlflowException

    record_file = inputs["tokenizer"] / "parent.json"
    if not evidence or not record_file.is_file():
        return []
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if not int(record["version"]):  # a folder: no registration run, no hypotheses
        return []
    try:
        parent = mlflow_runs.client(config).get_model_version(
            record["name"], str(record["version"])
        )
    except MlflowException as exc:
        log.info(
            "register: parent %s version %s not read: %s",
            record["name"],
            record["version"],
            redact_text(str(exc).splitlines()[0][:200]),
        )
        return []
    stored = stored_evidence(config, parent)
    if not stored:
        return []
    by_name = {s.name: s for s in evidence}
    return against_parent(config.register.metric, by_name, stored, config.languages[1])
