"""Register stage: the averaged model as an MLflow pyfunc "translator", versioned and aliased.

Each registration logs the model (weights, tokenizer, model and decoding configs as artifacts),
creates a registry version with lineage tags (every upstream stage's fingerprint, the run
config, the code version) and its scores, and points the ``candidate`` alias at it. The
``champion`` alias moves only when the new version beats the champion's metric on the same
test set under the same protocol (test set, variant, language pair, the metric's signature);
scores measured under another protocol are never compared, and the log and ``registered.json``
say so. ``translate_stream`` is ``tfm translate``: stdin lines in, translations out.

The pyfunc carries its own code (``code_paths``: copies of ``transformer_core`` and ``tasks``)
rather than a pip requirement on this project: the project is not on a package index, so an
environment built from the model's requirements (``mlflow models serve`` with virtualenv or
conda) could not install it, and the copy pins the exact code that wrote the weights. Its
``pip_requirements`` pin what that code imports (torch, sentencepiece, numpy, pyarrow, pyyaml)
to the installed versions; MLflow adds itself. Served with ``mlflow models serve -m
models:/<name>@champion``, it answers ``{"inputs": ["sentence", ...]}``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from tasks.artifacts import StageError, code_version, read_manifest, run_stage
from tasks.config import RunConfig, fingerprint, to_dict
from tasks.translate import decode_config

log = logging.getLogger(__name__)

STAGE = "register"
CANDIDATE = "candidate"
CHAMPION = "champion"
ARTIFACT_NAME = "translator"
SCORES_FILE = "scores.json"
# What must match before two scores may be compared.
PROTOCOL_KEYS = ("test_set", "test_variant", "pair", "signature")
REQUIREMENTS = ("torch", "sentencepiece", "numpy", "pyarrow", "pyyaml")


class ModelNotFoundError(StageError):
    """A model URI that names nothing in the registry (or no loadable model)."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """What the stage fingerprints besides its inputs (the registry it writes to included)."""
    return {
        "register": config.section("register"),
        "decode": to_dict(decode_config(config)),
        "tracking_uri": config.tracking_uri,
    }


# ----------------------------------------------------------------------------- pure helpers


def pip_requirements() -> list[str]:
    """``name==version`` of the installed distributions the pyfunc imports (local labels such
    as ``+cpu`` dropped: an index serves ``torch==2.13.0``, not ``2.13.0+cpu``)."""
    return [f"{name}=={metadata.version(name).split('+')[0]}" for name in REQUIREMENTS]


def read_scores(score_dir: Path, metric: str) -> dict[str, Any]:
    """The score folder's scores.json; a clear error if it or the deciding metric is missing."""
    path = Path(score_dir) / SCORES_FILE
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"register: {path} does not exist (run `tfm stage score` first)") from None
    except json.JSONDecodeError as exc:
        raise StageError(f"register: {path} is not valid JSON: {exc}") from None
    value = scores.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise StageError(
            f"register: {path} has no numeric {metric!r} (register.metric); keys: {sorted(scores)}"
        )
    return scores


def protocol(scores: Mapping[str, Any], metric: str) -> dict[str, str]:
    """The test set, variant, pair and the metric's own signature (``<metric>_signature``, else
    ``signature``), as strings. Works on scores.json and on a version's tags alike."""
    signature = scores.get(f"{metric}_signature", scores.get("signature", ""))
    return {
        "test_set": str(scores.get("test_set", "")),
        "test_variant": str(scores.get("test_variant", "")),
        "pair": str(scores.get("pair", "")),
        "signature": str(signature),
    }


def lineage(inputs: Mapping[str, Path]) -> dict[str, str]:
    """Fingerprint of every upstream stage, found by following the manifests' ``inputs`` chains.

    Keys are stage names (``download``, ``clean``, ``tokenizer``, ``shard``, ``train``, ...);
    a folder that no longer exists is named by its role, with the fingerprint its reader recorded.
    """
    found: dict[str, str] = {}
    seen: set[str] = set()
    stack: list[tuple[str, Path, str | None]] = [
        (role, Path(p), None) for role, p in inputs.items()
    ]
    while stack:
        role, path, recorded = stack.pop()
        key = str(path.resolve())
        if key in seen:
            continue
        seen.add(key)
        manifest = read_manifest(path)
        if manifest is None:
            if recorded:
                found.setdefault(role, recorded)
            continue
        found.setdefault(manifest.get("stage", role), manifest["fingerprint"])
        for up_role, info in (manifest.get("inputs") or {}).items():
            stack.append((up_role, Path(info["path"]), info.get("fingerprint")))
    return dict(sorted(found.items()))


def decide_champion(
    metric: str,
    new_scores: Mapping[str, Any],
    champion_tags: Mapping[str, str] | None,
) -> tuple[bool, str]:
    """(take the champion alias?, why). Strictly better on the same protocol wins; a champion
    measured under another protocol (or without the metric) is kept and never compared."""
    if champion_tags is None:
        return True, "no champion yet"
    new_protocol = protocol(new_scores, metric)
    old_protocol = protocol(champion_tags, metric)
    if new_protocol != old_protocol:
        diff = {
            k: (old_protocol[k], new_protocol[k])
            for k in PROTOCOL_KEYS
            if old_protocol[k] != new_protocol[k]
        }
        return False, f"not compared: protocol differs from the champion's ({diff}); champion kept"
    try:
        old = float(champion_tags[metric])
    except (KeyError, ValueError):
        return False, f"not compared: the champion has no {metric} tag; champion kept"
    new = float(new_scores[metric])
    if new > old:
        return True, f"{metric} {new:.4g} beats the champion's {old:.4g}"
    return False, f"{metric} {new:.4g} does not beat the champion's {old:.4g}; champion kept"


# ----------------------------------------------------------------------------- MLflow


def _client(tracking_uri: str) -> Any:
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The version an alias points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


@contextmanager
def _mlflow_run(config: RunConfig) -> Iterator[Any]:
    """The active run (the CLI and the flows open one per stage), or a new stage run."""
    import mlflow

    from tasks.runtime import setup_mlflow, stage_run

    active = mlflow.active_run()
    if active is not None:
        setup_mlflow(config)
        yield active
        return
    with stage_run(config, STAGE) as run:
        yield run


def _stage_model_files(
    staging: Path, weights: Path, tokenizer_dir: Path, config: RunConfig
) -> dict[str, str]:
    """Copy what the pyfunc needs into ``staging``; returns the artifacts mapping."""
    from tasks.translator import (
        ARTIFACT_DECODE,
        ARTIFACT_MODEL_CONFIG,
        ARTIFACT_TOKENIZER,
        ARTIFACT_WEIGHTS,
    )
    from transformer_core import checkpoint

    tok = staging / "tokenizer"
    tok.mkdir()
    spm = tokenizer_dir / "spm.model"
    if not spm.is_file():
        raise StageError(f"register: no tokenizer model at {spm} (run `tfm stage tokenizer` first)")
    for name in ("spm.model", "spm.vocab"):
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, tok / name)
    model_config = checkpoint.load(weights)["config"]
    (staging / "model_config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True))
    (staging / "decode.json").write_text(
        json.dumps(to_dict(decode_config(config)), indent=2, sort_keys=True)
    )
    return {
        ARTIFACT_WEIGHTS: str(weights),
        ARTIFACT_TOKENIZER: str(tok),
        ARTIFACT_MODEL_CONFIG: str(staging / "model_config.json"),
        ARTIFACT_DECODE: str(staging / "decode.json"),
    }


def _stage_code(staging: Path) -> list[str]:
    """Clean copies of this project's packages for ``code_paths`` (no caches)."""
    import tasks
    import transformer_core

    paths = []
    for package in (transformer_core, tasks):
        src = Path(package.__file__).parent
        dst = staging / "code" / src.name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        paths.append(str(dst))
    return paths


def register_model(
    config: RunConfig,
    weights: Path,
    tokenizer_dir: Path,
    scores: Mapping[str, Any],
    tags: Mapping[str, str],
) -> dict[str, Any]:
    """Log the pyfunc, create a registry version, set aliases; returns what registered.json holds."""
    import mlflow

    from tasks.translator import TranslatorModel

    name = config.register.model_name
    metric = config.register.metric
    client = _client(config.tracking_uri)
    with tempfile.TemporaryDirectory(prefix="register-") as tmp, _mlflow_run(config) as run:
        staging = Path(tmp)
        artifacts = _stage_model_files(staging, weights, tokenizer_dir, config)
        info = mlflow.pyfunc.log_model(
            name=ARTIFACT_NAME,
            python_model=TranslatorModel(),
            artifacts=artifacts,
            code_paths=_stage_code(staging),
            pip_requirements=pip_requirements(),
            registered_model_name=name,
        )
        run_id = run.info.run_id
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)

    previous = _alias_version(client, name, CHAMPION)
    take, reason = decide_champion(metric, scores, None if previous is None else previous.tags)
    client.set_registered_model_alias(name, CANDIDATE, version)
    if take:
        client.set_registered_model_alias(name, CHAMPION, version)
    log.info("register: %s version %s: %s", name, version, reason)
    client.set_model_version_tag(name, version, "champion_decision", reason)
    aliases = sorted(client.get_model_version(name, version).aliases)
    return {
        "name": name,
        "version": int(version),
        "aliases": aliases,
        "model_uri": f"models:/{name}/{version}",
        "run_id": run_id,
        "tracking_uri": config.tracking_uri,
        "metric": {"name": metric, "value": float(scores[metric])},
        "protocol": protocol(scores, metric),
        "champion": take,
        "decision": reason,
        "previous_champion": None
        if previous is None
        else {
            "version": int(previous.version),
            metric: _float_or_none(previous.tags.get(metric)),
            "protocol": protocol(previous.tags, metric),
        },
    }


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def version_tags(
    config: RunConfig, inputs: Mapping[str, Path], scores: Mapping[str, Any]
) -> dict[str, str]:
    """Lineage, config, code version and every scalar of scores.json (scores, signatures, test
    set: what ``protocol`` reads back) as registry tags (strings)."""
    tags = {f"lineage.{stage}": fp for stage, fp in lineage(inputs).items()}
    tags["code_version"] = code_version()
    tags["config"] = json.dumps(to_dict(config), sort_keys=True)
    tags["config_fingerprint"] = fingerprint(config)
    tags["pipeline.run"] = config.name
    tags["metric"] = config.register.metric
    for key, value in scores.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            tags[key] = str(value)
    return tags


# ----------------------------------------------------------------------------- the stage


def run(config: RunConfig, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Register the averaged model; writes ``registered.json`` and returns the folder."""
    average, tokenizer_dir, score = (Path(inputs[k]) for k in ("average", "tokenizer", "score"))
    inputs = {"average": average, "tokenizer": tokenizer_dir, "score": score}
    out_dir = config.root / STAGE
    force = force or _registered_version_missing(config, out_dir)

    def build(tmp: Path) -> dict[str, Any]:
        weights = average / "model.pt"
        if not weights.is_file():
            raise StageError(
                f"register: no checkpoint at {weights} (run `tfm stage average` first)"
            )
        scores = read_scores(score, config.register.metric)
        record = register_model(
            config, weights, tokenizer_dir, scores, version_tags(config, inputs, scores)
        )
        (tmp / "registered.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return {
            "name": record["name"],
            "version": record["version"],
            "aliases": record["aliases"],
            "champion": record["champion"],
            "decision": record["decision"],
            config.register.metric: record["metric"]["value"],
        }

    return run_stage(STAGE, out_dir, stage_config(config), inputs, build, force=force)


def _registered_version_missing(config: RunConfig, out_dir: Path) -> bool:
    """An earlier output whose registry version is gone (a new database): register again."""
    try:
        record = json.loads((out_dir / "registered.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    from mlflow.exceptions import MlflowException

    try:
        _client(config.tracking_uri).get_model_version(record["name"], str(record["version"]))
    except MlflowException:
        log.info(
            "register: %s version %s is not in %s; registering again",
            record.get("name"),
            record.get("version"),
            config.tracking_uri,
        )
        return True
    return False


# ----------------------------------------------------------------------------- serving


def load_translator(model_uri: str, tracking_uri: str | None = None) -> Any:
    """``mlflow.pyfunc.load_model(model_uri)``; a URI that names nothing is a ModelNotFoundError."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
    where = tracking_uri or mlflow.get_tracking_uri()
    try:
        return mlflow.pyfunc.load_model(model_uri)
    except (MlflowException, OSError) as exc:
        raise ModelNotFoundError(f"model {model_uri} cannot be loaded from {where}: {exc}") from exc


def translate_stream(
    model_uri: str,
    stdin: IO[str],
    stdout: IO[str],
    tracking_uri: str | None = None,
    batch_lines: int = 256,
) -> int:
    """Translate the lines of ``stdin`` to ``stdout`` (one line out per line in); returns the count.

    Lines are read in chunks of ``batch_lines`` so a long stream starts producing output early.
    """
    model = load_translator(model_uri, tracking_uri)
    count = 0
    chunk: list[str] = []
    for line in stdin:
        chunk.append(line.rstrip("\n").rstrip("\r"))
        if len(chunk) >= batch_lines:
            count += _write(model, chunk, stdout)
            chunk = []
    if chunk:
        count += _write(model, chunk, stdout)
    return count


def _write(model: Any, lines: list[str], stdout: IO[str]) -> int:
    for hyp in model.predict(lines):
        stdout.write(hyp + "\n")
    stdout.flush()
    return len(lines)
