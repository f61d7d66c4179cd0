"""train.keep_freed_memory: glibc, told by the workers' runtime env, stops faulting in a step's
large buffers afresh on every step (training/allocator.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from training.allocator import worker_runtime_env
from training.config import TrainConfig

# A Ray Train step's shape, as far as the allocator sees it: in a thread (Ray Train's), buffers
# of 64 MiB allocated, written and freed again and again; minor page faults counted over 10
# rounds after 15. Kept, the heap grows for the first ~10 (each freed buffer is a little short of
# the next aligned one until freed neighbours merge), then serves every buffer from freed memory.
STEPS = """
import resource, threading, torch
def steps():
    for _ in range(15):
        torch.ones(16 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        torch.ones(16 << 20)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=steps)
thread.start()
thread.join()
"""
PAGES = 10 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # every page of the 10 buffers, once


def _faults(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", STEPS],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


@pytest.mark.skipif(
    not (hasattr(os, "confstr") and "glibc" in (os.confstr("CS_GNU_LIBC_VERSION") or "")),
    reason="glibc's tunables",
)
def test_kept_freed_memory_is_not_faulted_in_again():
    default = _faults({})
    kept = _faults(worker_runtime_env(TrainConfig())["env_vars"])
    assert default > 0.9 * PAGES, default  # glibc's default: every buffer mapped afresh
    assert kept < 0.02 * PAGES, kept
    assert worker_runtime_env(TrainConfig(use_gpu=True)) == {}
