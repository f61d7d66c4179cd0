"""What the ranks share: sums and rank 0's decisions (no-ops on one process), and the RNG
states a checkpoint carries so that dropout continues exactly after a resume."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states as checkpoint-safe data."""
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy form, numpy's default
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int, rank: int) -> None:
    """Seed python, numpy and torch with a per-rank seed derived from ``(seed, rank)``."""
    derived = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def all_reduce_sum(values: Sequence[float | torch.Tensor], device: torch.device) -> list[float]:
    """Sum scalars across ranks (a no-op with one worker); returns Python floats."""
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values])
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return [float(x) for x in t.tolist()]


def broadcast_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's decision, on every rank (so every rank calls ``report`` together)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())
