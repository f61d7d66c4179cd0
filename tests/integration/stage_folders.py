"""Helpers the integration tests share (imported by name: this folder is on pytest's sys.path)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TINY_TRAINING = {
    "model": {"preset": "debug", "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2},
    "train": {
        "steps": 6,
        "tokens_per_step": 1024,
        "max_tokens_per_batch": 1024,
        "warmup_steps": 4,
        "eval_every": 3,
        "checkpoint_every": 2,
        "checkpoint_minutes": 0,
        "log_every": 1,
        "cpus_per_worker": 0.5,
    },
    "average": {"last": 2},
}
"""The model, train and average sections of the flow tests' configs: seconds of training."""

TINY_WORDS = "the a cat dog house tree sees likes big small red blue runs walks old new to".split()


def tiny_sentences(n: int, seed: int) -> list[str]:
    """Sentences of 1..24 words of ``TINY_WORDS`` whose lengths come in shuffled order."""
    rng = random.Random(seed)
    lengths = [1 + (7 * i) % 24 for i in range(n)]
    rng.shuffle(lengths)
    return [" ".join(rng.choice(TINY_WORDS) for _ in range(k)) for k in lengths]


def finished_folder(
    path: Path,
    stage: str,
    config: Any,
    build: Callable[[Path], Mapping[str, Any] | None],
    inputs: Mapping[str, Path] | None = None,
) -> Path:
    """A stage folder made by ``build(tmp) -> stats`` through the real stage contract."""
    from tasks.contract import run_stage

    return run_stage(stage, path, config, inputs or {}, build).path
