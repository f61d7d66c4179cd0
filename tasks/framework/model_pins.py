"""A registered model a config names (``models:/<name>@<alias>`` or ``/<version>``) pinned to one
registry version with its weights' sha256: what a stage that copies such a model (the parent of
a fine-tuning) resolves once before it runs, so that its fingerprint names the version and an
alias that moves later changes nothing in a running flow."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from filesystem.redact import redact_uri
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig
from tasks.framework.config_sections import ModelReference, TeacherPin
from tasks.framework.results import StageError

__all__ = ["registry_pin"]


def registry_pin(config: RunConfig, uri: str, key: str) -> TeacherPin:
    """The version ``uri`` names now in ``config``'s registry, with its weights' sha256 (the
    ``weights_sha256`` tag register sets, else the downloaded weights'); a StageError in one line
    naming ``key`` and the reference when there is no such model, version or alias."""
    from mlflow.exceptions import MlflowException

    from serving.pyfunc import WEIGHTS_TAG

    ref = ModelReference.parse(uri)
    client = mlflow_runs.client(config)
    try:
        if ref.alias is not None:
            found = client.get_model_version_by_alias(ref.name, ref.alias)
        else:
            found = client.get_model_version(ref.name, str(ref.version))
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise StageError(f"{key} {uri}: {_missing(client, ref, config)}") from None
    sha = found.tags.get(WEIGHTS_TAG) or _weights_sha256(config, ref.name, int(found.version))
    return TeacherPin(ref.name, int(found.version), sha, str(found.run_id), uri)


def _missing(client: Any, ref: ModelReference, config: RunConfig) -> str:
    """What the registry lacks, in words: the model, or the version or alias, with what is."""
    where = redact_uri(config.tracking_uri)
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{ref.name}'"))
    if not versions:
        return f"there is no registered model {ref.name!r} in {where}"
    what = f"alias {ref.alias!r}" if ref.alias is not None else f"version {ref.version}"
    listed = ", ".join(map(str, versions))
    return f"{ref.name} has no {what} in {where} (its versions: {listed})"


def _weights_sha256(config: RunConfig, name: str, version: int) -> str:
    """The sha256 of a version's weights, downloaded (a version registered without the tag)."""
    from serving.export import registered_files
    from transformer_core.folders import sha256_file

    with tempfile.TemporaryDirectory(prefix="pin-") as tmp:
        weights, _, _ = registered_files(
            f"models:/{name}/{version}", Path(tmp), config.tracking_uri
        )
        return sha256_file(weights)
