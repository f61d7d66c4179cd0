"""Stage teacher: the registered model the distill pipeline learns from, as one registry
version copied into the run.

In: the registry (``distill.teacher`` in ``mlflow.tracking_uri``'s). Out: ``model.pt``,
``tokenizer/``, ``decode.json`` (how it was registered to decode) and ``teacher.json`` (its
name, version, the reference it was found by, the weights' sha256, its MLflow run).

Its fingerprint is the version and the weights' sha256 (the version's ``weights_sha256`` tag,
which register sets; for a version without one, the downloaded weights' own), so a new
champion reruns it and everything after it, and the same version named another way does not.
The alias is resolved once per loaded config (``pinned``): the first stage of the flow, so
the folder holds the version its fingerprint names even if the alias moves while the flow
runs, and every later stage reads the teacher from this folder, never from the registry.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filesystem.redact import redact_uri
from tasks.framework import mlflow_runs
from tasks.framework.config import RunConfig
from tasks.framework.config_sections import ModelReference
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "teacher"
RECORD = "teacher.json"
_PINNED = "_pinned_teacher"
"""Where a loaded config's distill section keeps the version its teacher was resolved to."""


@dataclass(frozen=True)
class TeacherVersion:
    """The registry version a teacher reference names."""

    name: str
    version: int
    weights_sha256: str
    run_id: str
    found_by: str
    """The reference as the config wrote it (``models:/name@champion``)."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The teacher's name, registry version and weights' sha256."""
    t = pinned(config)
    return {"name": t.name, "version": t.version, "weights_sha256": t.weights_sha256}


def pinned(config: RunConfig) -> TeacherVersion:
    """The version ``distill.teacher`` names, resolved once for this loaded config (the first
    call, at the flow's first stage), however the alias moves after."""
    section = config.distill
    found = section.__dict__.get(_PINNED)
    if found is None:
        found = resolve(config)
        # Beside the fields, not one of them: never hashed nor logged, gone with the config.
        object.__setattr__(section, _PINNED, found)
    return found


def resolve(config: RunConfig) -> TeacherVersion:
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
    return TeacherVersion(ref.name, int(found.version), sha, str(found.run_id), uri)


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
    t = pinned(config)
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
