"""Stage teacher: the registered model the distill pipeline learns from, as one registry
version copied into the run.

In: the registry (``distill.teacher`` in ``mlflow.tracking_uri``'s). Out: ``model.pt``,
``tokenizer/``, ``decode.json`` (how it was registered to decode) and ``teacher.json`` (its
name, version, the reference it was found by, the weights' sha256, its MLflow run).

Its fingerprint is the version and the weights' sha256 (the version's ``weights_sha256`` tag,
which register sets; for a version without one, the downloaded weights' own), so a new
champion reruns it and everything after it, and the same version named another way does not.
Building a config asks the registry nothing: the stage's ``resolve`` asks it once, before the
stage runs (the flow's first stage), and the config the stage runs with carries the version
(``distill.pinned``), so the folder holds the version its fingerprint names even if the alias
moves while the flow runs; every later stage reads the teacher from this folder, never from the
registry. ``tfm status`` asks it too (``looked_up``), and where it does not answer, judges the
folder by the version it records, or shows the teacher as not resolved.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from filesystem.redact import redact_uri
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig
from tasks.framework.config_sections import ModelReference, TeacherPin
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "teacher"
RECORD = "teacher.json"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The teacher's name, registry version and weights' sha256 (``distill.pinned``); the version
    is None while the reference is not resolved (``tfm status`` before the stage ran)."""
    t = config.distill.pinned
    if t is None:
        name = ModelReference.parse(config.distill.teacher).name if config.distill.teacher else None
        return {"name": name, "version": None, "weights_sha256": None}
    return {"name": t.name, "version": t.version, "weights_sha256": t.weights_sha256}


def resolve(config: RunConfig) -> RunConfig:
    """``config`` with its teacher resolved in the registry (``distill.pinned``), unless it is
    already: what the stage runs with, so its fingerprint and its copy name one version."""
    if config.distill.pinned is not None:
        return config
    return config.replace(
        distill=dataclasses.replace(config.distill, pinned=registry_version(config))
    )


def looked_up(
    config: RunConfig, manifest: Mapping[str, Any] | None
) -> tuple[RunConfig, str | None]:
    """``config`` as ``tfm status`` judges the stage: resolved in the registry (a new champion
    shows its stages stale), else, where the registry does not answer or lacks the reference,
    as the folder's ``manifest`` records it for the same reference; and why it is not resolved
    from the registry, in words (None: it is)."""
    from mlflow.exceptions import MlflowException

    if config.distill.pinned is not None:
        return config, None
    try:
        return resolve(config), None
    except StageError as exc:  # no such model, version or alias
        why = str(exc)
    except MlflowException as exc:  # the server does not answer (an INTERNAL_ERROR), or refuses
        answer = "did not answer" if exc.error_code == "INTERNAL_ERROR" else exc.error_code
        where = redact_uri(config.tracking_uri)
        why = f"distill.teacher {config.distill.teacher}: the registry at {where} {answer}"
    stats = (manifest or {}).get("stats") or {}
    if stats.get("found_by") != config.distill.teacher:  # never ran, or for another reference
        return config, f"not resolved: {why}"
    pin = TeacherPin(
        stats["name"], stats["version"], stats["weights_sha256"], "", stats["found_by"]
    )
    pinned = config.replace(distill=dataclasses.replace(config.distill, pinned=pin))
    return pinned, f"version {pin.version} as its folder records it: {why}"


def registry_version(config: RunConfig) -> TeacherPin:
    """Ask the registry which version ``distill.teacher`` names now; a StageError in one line
    naming the reference when there is no such model, version or alias."""
    from mlflow.exceptions import MlflowException

    uri = config.distill.teacher
    if uri is None:
        raise StageError("distill.teacher is not set: the distill pipeline needs a teacher")
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
        raise StageError(f"distill.teacher {uri}: {_missing(client, ref, config)}") from None
    from serving.pyfunc import WEIGHTS_TAG

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

    with tempfile.TemporaryDirectory(prefix="teacher-") as tmp:
        weights, _, _ = registered_files(
            f"models:/{name}/{version}", Path(tmp), config.tracking_uri
        )
        return sha256_file(weights)


def build(ctx: BuildContext) -> dict[str, Any]:
    """Copy the pinned version's weights, tokenizer and decoding into ``ctx.tmp``."""
    from serving.export import registered_files
    from serving.tokenizer import FILES
    from transformer_core import checkpoint, count_parameters
    from transformer_core.folders import sha256_file

    config, tmp = ctx.config, ctx.tmp
    t = config.distill.pinned
    if t is None:  # the runner resolves it first (``resolve``)
        raise StageError(f"distill.teacher {config.distill.teacher} is not resolved")
    with tempfile.TemporaryDirectory(prefix="teacher-") as scratch:
        weights, tokenizer, decode = registered_files(
            f"models:/{t.name}/{t.version}", Path(scratch), config.tracking_uri
        )
        sha = sha256_file(weights)
        if sha != t.weights_sha256:
            raise StageError(
                f"{t.name} version {t.version}'s weights have sha256 {sha[:12]}..., "
                f"the registry said {t.weights_sha256[:12]}... when the run began: its copy "
                "changed; rerun to take the version as it is now"
            )
        shutil.copy2(weights, tmp / checkpoint.MODEL_FILE)
        (tmp / "tokenizer").mkdir()
        for name in FILES:
            if (tokenizer / name).is_file():
                shutil.copy2(tokenizer / name, tmp / "tokenizer" / name)
    (tmp / "decode.json").write_text(json.dumps(asdict(decode), indent=2, sort_keys=True) + "\n")
    record = {**asdict(t), "registry": redact_uri(config.tracking_uri)}
    (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    model = checkpoint.load_model(tmp / checkpoint.MODEL_FILE, map_location="cpu")
    log.info("teacher: %s version %d (%s)", t.name, t.version, t.found_by)
    return {
        "name": t.name,
        "version": t.version,
        "found_by": t.found_by,
        "weights_sha256": sha,
        "parameters": count_parameters(model),
        "n_layers": model.config.n_layers,
        "decoder_layers": model.config.n_decoder_layers,
    }
