"""``tfm status`` with the MLflow server down: loading a config asks it nothing, so every
shipped config's status exits 0, and a distill config's teacher, which status asks the registry
for, shows as not resolved (never ran) or as its folder records it (ran), saying why."""

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


def test_status_judges_a_teacher_by_the_registry_and_without_it_by_its_folder(tmp_path, capsys):
    """With the registry up, a new champion makes the teacher stale; with it down, the folder
    is judged by the version it records, and the row says the registry did not answer."""
    from helpers.flow_configs import distill_config, write_config
    from helpers.teachers import register_teacher

    from tasks.framework.config import load_config
    from tasks.framework.runner import run_stage

    registry = register_teacher(tmp_path / "registry", seed=0)
    path = write_config(tmp_path / "d.yaml", distill_config(tmp_path, registry))
    run_stage(load_config(path), "teacher")

    def teacher_row(*given: str) -> str:
        assert main(["status", path, *(a for s in given for a in ("--set", s))]) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("teacher "))

    assert teacher_row().split()[1:4] == ["up", "to", "date"]
    register_teacher(tmp_path / "registry", seed=1)  # a new champion
    row = teacher_row()
    assert row.split()[1] == "stale" and "config changed (version, weights_sha256)" in row
    closed = f"http://127.0.0.1:{free_port()}"
    row = teacher_row(f"mlflow.tracking_uri={closed}")
    assert row.split()[1:4] == ["up", "to", "date"]
    assert "version 1 as its folder records it: distill.teacher models:/flowtest@champion: " in row
    assert f"the registry at {closed} did not answer" in row
