"""Stage parent: the trained model a fine-tuning starts from (``train.init_from``), copied into
the run: a registry version, or a work dir's ``average/``, ``train/`` or Ray Train checkpoint
(``train_ray/<run>/step-<n>/``) folder.

Out: ``model.pt`` (the parent's weights; a Ray Train checkpoint's holds Adam's state too), its
tokenizer's files (``spm.model``, and ``pretokenize.json`` or ``bpe.codes`` where it has them)
and ``parent.json`` (its name, version, the reference it was found by, the weights' sha256). The
folder stands in for the tokenizer stage (the graph's ``replaces``): the parent's subwords are
what its embeddings mean, so the run trains no tokenizer, and the train stage starts from the
weights beside them.

Its fingerprint is the version and the weights' sha256 (for a folder: its path, version 0, and
the weights' sha256), so a new parent version reruns it and everything after it. As the
distill pipeline's teacher, the reference is resolved once, before the stage runs (the flow's
first stage: ``resolve``), and the config carries the pin (``RunConfig.parent``): an alias that
moves while the flow runs changes nothing in it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filesystem.redact import redact_uri
from tasks.framework.config import RunConfig, to_dict
from tasks.framework.config_sections import MODELS_SCHEME, ModelReference, TeacherPin
from tasks.framework.contract import BuildContext
from tasks.framework.model_pins import registry_pin
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "parent"
RECORD = "parent.json"
KEY = "train.init_from"
FOLDER_VERSION = 0
"""A parent given as a folder has no registry version: its pin says 0."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The parent's name, version and weights' sha256 (``RunConfig.parent``); the version is
    None while the reference is not resolved (``tfm status`` before the stage ran)."""
    pin = config.parent
    if pin is None:
        return {"name": _name(config.train.init_from), "version": None, "weights_sha256": None}
    return {"name": pin.name, "version": pin.version, "weights_sha256": pin.weights_sha256}


def _name(init_from: str | None) -> str | None:
    """A registered parent's model name, or a folder's path."""
    if init_from is None or not init_from.startswith(MODELS_SCHEME):
        return init_from
    return ModelReference.parse(init_from).name


def resolve(config: RunConfig) -> RunConfig:
    """``config`` with its parent pinned (``RunConfig.parent``), unless it is already: the
    registry's version now, or the folder's weights' sha256."""
    if config.parent is not None:
        return config
    return config.replace(parent=pin(config))


def pin(config: RunConfig) -> TeacherPin:
    """What ``train.init_from`` names now; a StageError in one line when it names nothing."""
    from transformer_core.folders import sha256_file

    uri = config.train.init_from
    if uri is None:
        raise StageError(f"{KEY} is not set: a fine-tuning needs a parent")
    if uri.startswith(MODELS_SCHEME):
        return registry_pin(config, uri, KEY)
    weights, _ = folder_files(Path(uri))
    return TeacherPin(uri, FOLDER_VERSION, sha256_file(weights), "", uri)


def folder_files(folder: Path) -> tuple[Path, Path]:
    """A work dir folder's weights (``average/model.pt``, ``train/final/model.pt``, a Ray Train
    checkpoint's ``model.pt``) and the work dir's tokenizer folder; a StageError naming what is
    missing."""
    from serving.tokenizer import MODEL_FILE as SPM_FILE
    from transformer_core.checkpoint import MODEL_FILE

    weights = next(
        (w for w in (folder / MODEL_FILE, folder / "final" / MODEL_FILE) if w.is_file()), None
    )
    if weights is None:
        raise StageError(
            f"{KEY} {folder}: no {MODEL_FILE} in it nor in its final/ (a work dir's average/ or "
            "train/ folder, or models:/<name>@<alias>)"
        )
    # average/ and train/ are the work dir's; a Ray Train checkpoint is train_ray/<run>/step-<n>.
    # A fine-tuned work dir holds its tokenizer in its parent stage's folder.
    for workdir in list(folder.parents)[:3]:
        for name in ("tokenizer", STAGE):
            if (workdir / name / SPM_FILE).is_file():
                return weights, workdir / name
    raise StageError(f"{KEY} {folder}: no tokenizer/ folder in its work dir ({folder.parent})")


def looked_up(
    config: RunConfig, manifest: Mapping[str, Any] | None
) -> tuple[RunConfig, str | None]:
    """``config`` as ``tfm status`` judges the stage: pinned now where the registry (or the
    folder) answers, else as the stage's ``manifest`` records it for the same reference; and
    why it is not pinned now, in words (None: it is)."""
    from mlflow.exceptions import MlflowException

    if config.parent is not None:
        return config, None
    try:
        return resolve(config), None
    except StageError as exc:  # no such model, version, alias or folder
        why = str(exc)
    except MlflowException as exc:  # the server does not answer, or refuses
        why = f"{KEY}: the registry at {redact_uri(config.tracking_uri)} said {exc.error_code}"
    stats = (manifest or {}).get("stats") or {}
    if stats.get("found_by") != config.train.init_from:  # never ran, or for another parent
        return config, f"not resolved: {why}"
    found = TeacherPin(
        stats["name"], stats["version"], stats["weights_sha256"], "", stats["found_by"]
    )
    return config.replace(parent=found), f"version {found.version} as its folder records it: {why}"


def build(ctx: BuildContext) -> dict[str, Any]:
    """Copy the pinned parent's weights and tokenizer into ``ctx.tmp``; refuse a config whose
    model or vocabulary is not the parent's, in one line."""
    from serving.tokenizer import FILES, load
    from training.parent_weights import shape_mismatch
    from transformer_core import checkpoint
    from transformer_core.config import ModelConfig

    config, tmp = ctx.config, ctx.tmp
    p = config.parent
    if p is None:  # the runner resolves it first (``resolve``)
        raise StageError(f"{KEY} {config.train.init_from} is not resolved")
    with tempfile.TemporaryDirectory(prefix="parent-") as scratch:
        weights, tokenizer = _files(config, p, Path(scratch))
        _copy(weights, tokenizer, p, tmp, FILES)
    saved = checkpoint.load(tmp / checkpoint.MODEL_FILE)
    model = ModelConfig.from_dict(saved["config"])
    problem = shape_mismatch(config.model, model)
    pieces = load(tmp).vocab_size
    if problem is None and config.tokenizer.vocab_size != pieces:
        problem = f"tokenizer.vocab_size {config.tokenizer.vocab_size} != parent's {pieces}"
    if problem is not None:
        raise StageError(f"{KEY} {p.found_by}: {problem}")
    record = {**dataclasses.asdict(p), "registry": redact_uri(config.tracking_uri)}
    (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log.info("parent: %s version %d (%s)", p.name, p.version, p.found_by)
    return {
        "name": p.name,
        "version": p.version,
        "found_by": p.found_by,
        "weights_sha256": p.weights_sha256,
        "vocab_size": pieces,
        "model": to_dict(model),
        "optimizer": "optimizer" in saved,  # a Ray Train checkpoint's Adam state
    }


def _files(config: RunConfig, p: TeacherPin, scratch: Path) -> tuple[Path, Path]:
    """The pinned parent's weights file and tokenizer folder (downloaded into ``scratch``)."""
    from serving.export import registered_files

    if p.version == FOLDER_VERSION:
        return folder_files(Path(p.name))
    weights, tokenizer, _ = registered_files(
        f"models:/{p.name}/{p.version}", scratch, config.tracking_uri
    )
    return weights, tokenizer


def _copy(weights: Path, tokenizer: Path, p: TeacherPin, tmp: Path, files: tuple[str, ...]) -> None:
    """The weights (checked against the pin's sha256) and the tokenizer's files into ``tmp``."""
    from transformer_core.checkpoint import MODEL_FILE
    from transformer_core.folders import sha256_file

    sha = sha256_file(weights)
    if sha != p.weights_sha256:
        raise StageError(
            f"{KEY} {p.found_by}: the weights have sha256 {sha[:12]}..., {p.weights_sha256[:12]}"
            "... when the run began: they changed; rerun to take them as they are now"
        )
    shutil.copy2(weights, tmp / MODEL_FILE)
    for name in files:
        if (tokenizer / name).is_file():
            shutil.copy2(tokenizer / name, tmp / name)
