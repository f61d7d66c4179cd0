"""The console of a real ``tfm stage`` through Ray Data: our lines there, Ray Data's INFO lines in
the run log, and back on the console with ``-v``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # three `tfm stage` processes, ~1 min idle

RAY_DATA_INFO = "Execution plan of Dataset"
"""Ray Data's INFO line at the start of every dataset's execution (ray 2.60's streaming
executor)."""


def _tfm(config: Path, env: dict[str, str], *args: str) -> str:
    """Run ``tfm stage ...``; its console (stdout and stderr together)."""
    command = [sys.executable, "-m", "pipelines.cli", *args, "--config", str(config)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[2]
    )
    console = done.stdout + done.stderr
    assert done.returncode == 0, console
    return console


def test_ray_data_info_lines_go_to_the_run_log_and_v_brings_them_back(tmp_path):
    config = tmp_path / "console.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "console",
                "workdir": str(tmp_path / "{name}"),
                "data": {
                    "source": "synthetic",
                    "synthetic_train": 200,
                    "synthetic_dev": 20,
                    "synthetic_test": 20,
                },
                "ray": {"num_cpus": 2},
            }
        )  # fmt: skip
    )
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    for name in ("RAY_DATA_LOGGING_CONFIG", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"):
        env.pop(name, None)
    _tfm(config, env, "stage", "download")
    quiet = _tfm(config, env, "stage", "clean")
    run_log = (tmp_path / "console" / "logs" / "tfm.log").read_text(encoding="utf-8")
    assert "stage clean: running" in quiet  # our progress line stays
    assert RAY_DATA_INFO not in quiet, quiet
    assert " INFO ray.data" not in quiet
    assert "Downloading artifacts" not in quiet
    assert "View run" not in quiet  # MLflow's link per run; the summary names the UI
    assert RAY_DATA_INFO in run_log
    loud = _tfm(config, env, "-v", "stage", "clean", "--force")
    assert RAY_DATA_INFO in loud
