"""Checkpoints that carry their model config, written atomically, read with ``weights_only=True``.

A checkpoint is a dict of tensors and plain Python types only (so the safe unpickler reads it):
``model`` (state dict), ``config`` (``ModelConfig.to_dict()``), ``vocab_size``,
``tgt_vocab_size``, ``format_version``, plus any extras (optimizer state, step, RNG states).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from transformer_core.config import ModelConfig

if TYPE_CHECKING:
    from transformer_core.model import Transformer

MODEL_FILE = "model.pt"
"""The checkpoint file's name in a folder that holds one (a stage's, a Ray Train checkpoint's)."""
FORMAT_VERSION = 1
_RESERVED = ("model", "config", "vocab_size", "tgt_vocab_size", "format_version")
_PLAIN = (str, int, float, bool, type(None))


def model_file(path: str | Path) -> Path:
    """The checkpoint file: ``path`` itself, or ``path/model.pt`` for a folder holding one."""
    path = Path(path)
    return path / MODEL_FILE if path.is_dir() else path


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not match what the caller expects."""


def save(
    path: str | Path,
    model_state_dict: Mapping[str, torch.Tensor] | nn.Module,
    config: ModelConfig,
    *,
    vocab_size: int,
    tgt_vocab_size: int | None = None,
    **extra: Any,
) -> Path:
    """Write a checkpoint to ``path`` via a temporary sibling and a rename; returns ``path``.

    ``model_state_dict`` may be a module (its ``state_dict()`` is taken). Extras must be tensors
    or plain Python data (dict/list/tuple of str, int, float, bool, None); anything else is a
    TypeError naming the key, raised before anything is written.
    """
    path = Path(path)
    if isinstance(model_state_dict, nn.Module):
        model_state_dict = model_state_dict.state_dict()
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"extra keys {clash} clash with the checkpoint's own keys")
    payload: dict[str, Any] = {
        "model": dict(model_state_dict),
        "config": config.to_dict(),
        "vocab_size": int(vocab_size),
        "tgt_vocab_size": None if tgt_vocab_size is None else int(tgt_vocab_size),
        "format_version": FORMAT_VERSION,
        **extra,
    }
    for key, value in payload.items():
        _check_plain(value, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by ``save`` (``weights_only=True``); errors name the path."""
    path = Path(path)
    data = read_weights(path, map_location)
    if not isinstance(data, dict) or not {"model", "config", "format_version"} <= set(data):
        raise CheckpointError(
            f"{path} is not a transformer_core checkpoint (no model/config/format_version keys)"
        )
    if data["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {data['format_version']}; this code reads up to "
            f"{FORMAT_VERSION}"
        )
    return data


def read_weights(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with errors that name the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} is corrupted or unreadable: {exc}") from exc


def load_model(
    path: str | Path,
    expected_config: ModelConfig | None = None,
    map_location: str | torch.device = "cpu",
) -> Transformer:
    """Rebuild the model from the checkpoint's own config and load its weights (eval mode).

    With ``expected_config``, a checkpoint trained with another config is an error naming the
    fields that differ.
    """
    from transformer_core.model import Transformer

    path = Path(path)
    data = load(path, map_location)
    try:
        config = ModelConfig.from_dict(data["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} holds an invalid model config: {exc}") from exc
    if expected_config is not None:
        diff = config_diff(config, expected_config)
        if diff:
            raise CheckpointError(
                f"{path} was written with another model config: "
                + "; ".join(f"{k}: checkpoint {a!r}, expected {b!r}" for k, (a, b) in diff.items())
            )
    model = Transformer(config, data["vocab_size"], data.get("tgt_vocab_size"))
    try:
        model.load_state_dict(data["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weights do not fit the model: {exc}") from exc
    return model.eval()


def config_diff(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ, as ``{field: (a's value, b's value)}``."""
    da, db = a.to_dict(), b.to_dict()
    return {k: (da[k], db[k]) for k in da if da[k] != db[k]}


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is a tensor or plain data the safe unpickler accepts."""
    # Exact types: numpy scalars subclass float/int but the safe unpickler refuses them.
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint entry {where} has a key of type {type(k).__name__}")
            _check_plain(v, f"{where}.{k}")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"checkpoint entry {where} is a {type(value).__name__}; only tensors and plain Python "
        "data load with weights_only=True"
    )
