"""glibc's allocator on CPU training workers: freed memory kept for the next step
(``train.keep_freed_memory``).

A CPU step allocates and frees buffers of tens to hundreds of MiB (the (tokens, vocab) logits
and their gradients). glibc serves each with its own mmap and unmaps it when it is freed, so
the kernel faults in and zeroes every page of it again on the next step: on one worker of the
Multi30k recipe (4,096 tokens, one thread) that was 202k page faults and 0.67 s of system time
a step, against 1.9 s of user time. With no mmap and no trimming, freed memory stays in the heap
and is reused: 1.29x the recipe's speed (docs/benchmarks.md). These are glibc's tunables, read
once when a process starts, so they go in the workers' runtime env; elsewhere than glibc they
are ignored. Hand-written because it is three environment variables.
"""

from __future__ import annotations

import os
from typing import Any

from training.config import TrainConfig

KEEP_FREED_MEMORY = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}
"""No mmap and no trimming keep freed memory in the heap. One arena because Ray Train steps in a
thread, and with a thread's own arena the faults stayed (measured on a step in a thread: 200k
faults with the first two alone, 13k with all three; docs/benchmarks.md)."""


def worker_runtime_env(train: TrainConfig) -> dict[str, Any]:
    """Ray's runtime env for the training workers: ``KEEP_FREED_MEMORY`` on CPUs, if kept."""
    if train.use_gpu or not train.keep_freed_memory:
        return {}
    return {"env_vars": dict(KEEP_FREED_MEMORY)}


def kept_here() -> bool:
    """Whether this process started with ``KEEP_FREED_MEMORY`` (a worker reports it)."""
    return all(os.environ.get(name) == value for name, value in KEEP_FREED_MEMORY.items())
