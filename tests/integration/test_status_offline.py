"""``tfm status`` of every shipped config with the MLflow server down: it asks no server (a
distill config's teacher shows as not resolved yet), and exits 0. A registry is asked only by
the stage that needs it (the teacher, register), as it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.mlflow_server import free_port

from pipelines.cli import main

pytestmark = pytest.mark.integration

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_status_of_every_shipped_config_works_with_the_tracking_server_down(
    tmp_path, capsys, monkeypatch
):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", closed)
    assert len(CONFIGS) >= 10
    for path in CONFIGS:
        given = [f"workdir={tmp_path}/{{name}}", f"mlflow.tracking_uri={closed}"]
        code = main(["status", str(path), *(a for s in given for a in ("--set", s))])
        lines = capsys.readouterr().out.splitlines()
        assert (path.name, code) == (path.name, 0)
        assert lines[0].split() == ["stage", "state", "why"]
        assert all(line.split()[1] == "missing" for line in lines[1:] if line.strip())
        if "distill" in path.stem:
            teacher = next(line for line in lines if line.startswith("teacher "))
            assert f"@champion: the registry at {closed} did not answer" in teacher
            assert "; not resolved: distill.teacher models:/" in teacher
