"""`make gpu-recipe` on a machine without CUDA: one line that says so, and a non-zero exit."""

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
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-recipe: no CUDA device"), run.stderr
    assert not (tmp_path / "v").exists()  # nothing installed before the check
