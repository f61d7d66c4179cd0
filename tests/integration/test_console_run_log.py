"""The console of real ``tfm`` commands: a whole tiny flow prints the pipeline's lines only (no
line of Ray's, within a line budget), Ray Data's INFO lines go to the run log and come back with
``-v``, and a stage that fails on bad input says so once, in ``tfm:``'s line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.flow_configs import tiny_config, write_config

# `tfm run` twice (one whole tiny flow, one that stops at download) and `tfm stage` once: ~3 min
pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY_DATA_INFO = "Execution plan of Dataset"
"""Ray Data's INFO line at the start of every dataset's execution (ray 2.60's streaming
executor)."""
RAY_CORE_LINE = re.compile(r"^(\(\S+ pid=\d+\) )?\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] ")
"""Ray Core's own log line, ``[2026-11-29 06:28:06,308 E 4644 4644] core_worker.cc:2465: ...``
(a worker's behind its ``(Name pid=...)`` prefix)."""
RAY_PYTHON_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\t[A-Z]+ \S+\.py:\d+ -- ")
"""Ray's Python loggers' format: ``2026-11-29 06:27:50,090\tWARNING authentication_token_setup.py:85
-- Token authentication is enabled ...``."""
LINE_BUDGET = 62
"""A clean run of the tiny flow printed 57 lines (2026-11-29, ray 2.60): progress, the summary,
the hints; a slower machine prints a progress line or two more."""


def _tfm(env: dict[str, str], *args: str, returncode: int = 0) -> str:
    """Run ``tfm ...``; its console (stdout, then stderr)."""
    command = [sys.executable, "-m", "pipelines.cli", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=900, cwd=Path(__file__).parents[2]
    )
    console = done.stdout + done.stderr
    assert done.returncode == returncode, console
    return console


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """A fresh shell's environment: none of the switches a command of this process set."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect"))}
    for name in (
        "RAY_DATA_LOGGING_CONFIG",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
        "RAY_AUTH_MODE",  # what a local ray.init in this process set
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER",
        "RAY_ADDRESS",
    ):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def flow(tmp_path_factory, env) -> tuple[str, Path, str]:
    """A whole tiny flow by ``tfm run``: its config, work dir and console."""
    tmp = tmp_path_factory.mktemp("console")
    config = write_config(tmp / "console.yaml", tiny_config(tmp, name="console"))
    return config, tmp / "console", _tfm(env, "run", config)


def test_a_run_prints_the_pipelines_lines_only_within_its_budget(flow):
    _, _, console = flow
    lines = console.splitlines()
    assert not [line for line in lines if RAY_CORE_LINE.match(line)], console
    assert not [line for line in lines if RAY_PYTHON_LINE.match(line)], console
    assert "Token authentication" not in console
    assert len(lines) <= LINE_BUDGET, console
    assert "scores: " in console  # the run went through


def test_ray_data_info_lines_go_to_the_run_log_and_v_brings_them_back(flow, env):
    config, workdir, quiet = flow
    run_log = (workdir / "logs" / "tfm.log").read_text(encoding="utf-8")
    assert "stage clean: running" in quiet  # our progress line stays
    assert RAY_DATA_INFO not in quiet, quiet
    assert " INFO ray.data" not in quiet
    assert "Downloading artifacts" not in quiet
    assert "View run" not in quiet  # MLflow's link per run; the summary names the UI
    assert RAY_DATA_INFO in run_log
    loud = _tfm(env, "-v", "stage", "clean", "--force", "--config", config)
    assert RAY_DATA_INFO in loud


def test_a_stage_that_fails_on_bad_input_says_so_once(tmp_path, env):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "dev", "test"):
        for lang, word in (("en", "house"), ("de", "Haus")):
            rows = 40 - (split == "train" and lang == "de")  # train.de: a line short
            text = "".join(f"the {word} {i}\n" for i in range(rows))
            (corpus / f"{split}.{lang}").write_text(text, encoding="utf-8")
    data = {"data.source": "local", "data.local_dir": str(corpus), "data.mirror": None}
    config = write_config(tmp_path / "bad.yaml", tiny_config(tmp_path, name="bad", **data))
    console = _tfm(env, "run", config, returncode=1)
    errors = [line for line in console.splitlines() if line.startswith("tfm: ")]
    assert len(errors) == 1 and "train" in errors[0], console
    message = errors[0].rpartition(": ")[2]  # the reader's own words, whichever they are
    assert sum(message in line for line in console.splitlines()) == 1, console
    assert message in (tmp_path / "bad" / "logs" / "tfm.log").read_text(encoding="utf-8")
