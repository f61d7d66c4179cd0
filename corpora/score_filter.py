"""Dropping the pairs a model scored worst (the distill pipeline's filter stage): ``worst``."""

from __future__ import annotations

import numpy as np

__all__ = ["worst"]


def worst(scores: np.ndarray, share: float, keep: np.ndarray | None = None) -> np.ndarray:
    """A mask of the ``floor(share * n)`` lowest ``scores`` among the rows ``keep`` allows (all
    when None; n counts those), ties taken in row order: the same rows on every run."""
    scores = np.asarray(scores, dtype=np.float64)
    allowed = np.ones(len(scores), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    rows = np.flatnonzero(allowed)
    drop = int(share * len(rows))
    order = rows[np.argsort(scores[rows], kind="stable")]  # lowest first
    mask = np.zeros(len(scores), dtype=bool)
    mask[order[:drop]] = True
    return mask
