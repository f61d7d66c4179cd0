"""A registered translator's version as files and as a ``Translator``: a model URI's alias
followed to one version, its artifacts downloaded, and its engine chosen. ``tfm serve``,
``tfm translate --model`` and ``tfm export --model`` read a version through it, with this
process's code (the version's own copy of the code is what ``mlflow.pyfunc.load_model`` runs)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from serving import ServingError
from serving.ct2_options import ComputeType
from serving.decode_config import DecodeConfig
from serving.mlflow_uris import pointed_at
from serving.scoring_protocol import RequestLimits
from serving.translator import Translator

__all__ = [
    "ModelNotFoundError",
    "VersionFiles",
    "download",
    "load_translator",
    "pinned_uri",
    "resolve",
    "set_version_tags",
    "version_tags",
]

# Names of the pyfunc's artifacts (keys of ``context.artifacts``): what a version holds.
ARTIFACT_WEIGHTS = "weights"
ARTIFACT_TOKENIZER = "tokenizer"
ARTIFACT_MODEL_CONFIG = "model_config"
ARTIFACT_DECODE = "decode"
ARTIFACT_CTRANSLATE2 = "ctranslate2"
"""With decode.engine ctranslate2: the CTranslate2 export of the weights, made at registration."""
ARTIFACT_LIMITS = "limits"
"""The request limits of the config that registered the version (``RequestLimits``); a
version registered before them has the defaults."""
MODELS = "models:/"


class ModelNotFoundError(ServingError):
    """A model URI that names nothing in the registry (or no loadable model)."""


@dataclass(frozen=True)
class VersionFiles:
    """A downloaded version: where its files are, and how it decodes."""

    uri: str
    """The URI it was downloaded by (``models:/NAME/VERSION`` when the registry was asked)."""
    weights: Path
    tokenizer: Path
    decode: DecodeConfig
    """Its decoding settings (decode.json)."""
    model_config: dict[str, Any] | None
    """Its model config (model_config.json), checked against the checkpoint's own."""
    ctranslate2: Path | None
    """Its CTranslate2 export, if it was registered with one."""
    limits: RequestLimits
    """Its request limits (limits.json; the defaults without one)."""


def _reference(model_uri: str) -> tuple[str, str | None, int | None]:
    """Name, alias and version of ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``."""
    rest = model_uri[len(MODELS) :] if model_uri.startswith(MODELS) else ""
    name, at, alias = rest.partition("@")
    if at and name and alias and "/" not in rest:
        return name, alias, None
    name, _, version = rest.partition("/")
    if name and version.isdigit() and int(version) >= 1:
        return name, None, int(version)
    raise ModelNotFoundError(
        f"{model_uri!r} is not a registered model's URI: models:/NAME@ALIAS or models:/NAME/VERSION"
    )


def resolve(model_uri: str, tracking_uri: str | None) -> tuple[str, int, str | None]:
    """The registered model's name, the version ``model_uri`` names now (its alias followed) and
    the alias (None for a version URI); a ModelNotFoundError saying what the registry holds."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    name, alias, version = _reference(model_uri)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        if alias is not None:
            return name, int(client.get_model_version_by_alias(name, alias).version), alias
        return name, int(client.get_model_version(name, str(version)).version), None
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
    what = f"alias {alias!r}" if alias is not None else f"version {version}"
    found = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
    held = f"its versions: {', '.join(map(str, found))}" if found else "no such model"
    raise ModelNotFoundError(f"{model_uri}: {name} has no {what} in the registry ({held})")


def pinned_uri(name: str, version: int) -> str:
    """``models:/NAME/VERSION``: one version, whatever its aliases do later."""
    return f"{MODELS}{name}/{version}"


def download(model_uri: str, dst: Path, tracking_uri: str | None = None) -> VersionFiles:
    """Download a registered translator's artifacts into ``dst``."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        with pointed_at(tracking_uri):
            local = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(dst)))
    except (MlflowException, OSError) as exc:
        raise ModelNotFoundError(f"model {model_uri} cannot be downloaded: {exc}") from exc
    flavor = yaml.safe_load((local / "MLmodel").read_text())["flavors"].get("python_function", {})
    paths = {key: local / value["path"] for key, value in (flavor.get("artifacts") or {}).items()}
    if ARTIFACT_WEIGHTS not in paths or ARTIFACT_TOKENIZER not in paths:
        raise ServingError(
            f"model {model_uri} is not a registered translator (no weights/tokenizer)"
        )

    def stored(key: str) -> dict[str, Any] | None:
        return json.loads(paths[key].read_text()) if key in paths else None

    return VersionFiles(
        uri=model_uri,
        weights=paths[ARTIFACT_WEIGHTS],
        tokenizer=paths[ARTIFACT_TOKENIZER],
        decode=DecodeConfig.from_dict(stored(ARTIFACT_DECODE) or {}),
        model_config=stored(ARTIFACT_MODEL_CONFIG),
        ctranslate2=paths.get(ARTIFACT_CTRANSLATE2),
        limits=RequestLimits.from_dict(stored(ARTIFACT_LIMITS) or {}),
    )


Engine = Literal["auto", "torch", "ctranslate2"]


def load_translator(
    files: VersionFiles,
    engine: Engine = "auto",
    compute_type: ComputeType | None = None,
    threads: int = 0,
) -> Translator:
    """The version as a ``Translator``: with ``engine`` auto, on its CTranslate2 export where it
    has one and as it was registered otherwise; torch or ctranslate2 force one (a version with
    no export is exported beside its weights). ``compute_type`` (ctranslate2) and ``threads``
    (0: the library's default) replace the version's."""
    from transformer_core.config import ModelConfig

    decode = files.decode
    if engine == "auto":
        engine = "ctranslate2" if files.ctranslate2 is not None else decode.engine
    if engine == "torch":
        decode = replace(decode, engine="torch", compute_type="default")
    else:
        precision = compute_type or (decode.compute_type if decode.engine == engine else "default")
        decode = replace(decode, engine="ctranslate2", compute_type=precision, dtype="float32")
    if threads:
        decode = replace(decode, threads=threads)
    expected = None if files.model_config is None else ModelConfig.from_dict(files.model_config)
    return Translator.load(
        files.weights,
        files.tokenizer,
        decode,
        expected_config=expected,
        export_dir=files.ctranslate2,
    )


def version_tags(name: str, version: int, tracking_uri: str | None) -> dict[str, str]:
    """The tags of one registered version."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return dict(client.get_model_version(name, str(version)).tags)


def set_version_tags(
    name: str, version: int, tags: Mapping[str, str], tracking_uri: str | None
) -> None:
    """Set ``tags`` on one registered version (``tfm evaluate``'s figures)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, str(version), key, value)
