"""Checkpoint averaging (paper 6.1: the mean of the last 5 or 20 checkpoints' weights)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from transformer_core.checkpoint import CheckpointError, read_weights


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the model weights of ``paths``, as a state dict.

    Accepts checkpoints written by ``checkpoint.save`` (their ``model`` entry) or bare state
    dicts. Floating tensors are summed in float32 one file at a time (memory: one model plus one
    accumulator) and cast back to the first file's dtype; integer and bool tensors must be equal
    in every file. Keys that share one tensor in the first file (tied embeddings) share one
    averaged tensor in the result. Differing keys or shapes are an error naming the key and
    the files.
    """
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    first = _state_dict(files[0])
    alias = _aliases(first)
    sums = {
        k: v.float().clone() if v.is_floating_point() else v
        for k, v in first.items()
        if k not in alias
    }
    dtypes = {k: v.dtype for k, v in first.items()}
    shapes = {k: v.shape for k, v in first.items()}
    del first  # keep one model's worth of accumulators, not two
    for path in files[1:]:
        state = _state_dict(path)
        missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
        if missing or extra:
            key = (missing or extra)[0]
            raise CheckpointError(
                f"checkpoint keys differ: {key!r} is in "
                f"{files[0] if missing else path} but not in {path if missing else files[0]} "
                f"(missing {missing[:5]}, unexpected {extra[:5]})"
            )
        for key, value in state.items():
            if value.shape != shapes[key]:
                raise CheckpointError(
                    f"shape of {key!r} differs: {tuple(shapes[key])} in {files[0]}, "
                    f"{tuple(value.shape)} in {path}"
                )
            if key in alias:
                continue
            if dtypes[key].is_floating_point:
                sums[key] += value.float()
            elif not torch.equal(value, sums[key]):
                raise CheckpointError(
                    f"non-floating tensor {key!r} differs between {files[0]} and {path}; "
                    "it cannot be averaged"
                )
    n = len(files)
    means = {
        k: (v / n).to(dtypes[k]) if dtypes[k].is_floating_point else v for k, v in sums.items()
    }
    return {k: means[alias.get(k, k)] for k in shapes}


def _aliases(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """``{key: earlier key}`` for entries that are views of the very same tensor data."""
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for key, value in state.items():
        ident = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if value.numel() and ident in seen:
            alias[key] = seen[ident]
        else:
            seen.setdefault(ident, key)
    return alias


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    data = read_weights(path)
    state = data.get("model", data) if isinstance(data, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds no model state dict of tensors")
    return state
