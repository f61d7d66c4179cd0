"""`make gpu-recipe` and `make bench-gpu` on a machine without CUDA, or a Python without torch: one
line that says so, and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_recipe_without_cuda_fails_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_recipe.py"), "--venv", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-recipe: no CUDA device"), run.stderr
    assert not (tmp_path / "v").exists()  # nothing installed before the check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("flags", [[], ["-S"]], ids=["cpu-torch", "no-packages"])
def test_bench_gpu_preflight_without_cuda_fails_in_one_line(flags):
    # -S: no site-packages, so neither numpy nor torch (a bare system Python, as GPU_PYTHON's
    # default)
    run = subprocess.run(
        [sys.executable, *flags, str(ROOT / "benchmarks" / "gpu.py"), "--preflight"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench-gpu: no "), run.stderr
