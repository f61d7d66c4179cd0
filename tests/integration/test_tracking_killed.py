"""A flow's process SIGKILLed with its MLflow runs open, against a real MLflow server
(``mlflow server`` on 127.0.0.1, SQLite): ``tfm status`` names the killed flow run without
changing it; the next command of the work dir (``tfm stage``'s run) ends the flow's run and its
stage's as KILLED at the process's last record; a live process's runs in the same work dir stay
RUNNING; ``tfm status`` then says they were ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.mlflow_server import MlflowServer

from tracking.journal import journals

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 40 s of it the server's start

FLOW = """
import sys, time, yaml
from tasks.framework import mlflow_runs
from tasks.framework.config import config_from_dict

config = config_from_dict(yaml.safe_load(open(sys.argv[1])))
with mlflow_runs.pipeline_run(config, "p", {}) as flow:
    with mlflow_runs.stage_run(config, "train") as stage:
        assert flow.drain() and stage.drain()
        print(flow.run_id, stage.run_id, flush=True)
        time.sleep(600)
"""
"""A flow's process as `tfm run` opens its runs: the flow's run, a stage's under it; blocks."""


@pytest.fixture
def server(mlflow_server):
    return mlflow_server


def write(tmp_path: Path, server: MlflowServer) -> str:
    config = {
        "name": "k",
        "workdir": str(tmp_path / "work"),
        "mlflow": {"tracking_uri": server.uri, "experiment": "killed", "http_timeout": 5},
    }
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def start_flows(config: str, n: int) -> list[tuple[subprocess.Popen, list[str]]]:
    """``n`` flow processes, started together; each with its runs' MLflow ids, once they are
    on the server."""
    procs = [
        subprocess.Popen([sys.executable, "-c", FLOW, config], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    started = []
    for proc in procs:
        assert proc.stdout is not None
        ids = proc.stdout.readline().split()
        assert len(ids) == 2, proc.wait()
        started.append((proc, ids))
    return started


def status_lines(config: str, capsys) -> list[str]:
    from pipelines.cli import main

    assert main(["status", config]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if "was killed" in line]


@pytest.mark.timeout(300)
def test_a_killed_flows_runs_end_as_killed_and_a_live_ones_stay_running(
    server, tmp_path, capsys, caplog
):
    from mlflow.tracking import MlflowClient

    from tasks.framework import mlflow_runs
    from tasks.framework.config import load_config

    config = write(tmp_path, server)
    (killed, (flow_id, stage_id)), (live, live_ids) = start_flows(config, 2)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        client = MlflowClient(server.uri)
        assert client.get_run(flow_id).info.status == "RUNNING"  # MLflow cannot tell
        (said,) = status_lines(config, capsys)
        assert f"flow run k/p ({flow_id}) was killed: process {killed.pid}" in said
        assert "the next `tfm run`" in said
        assert client.get_run(flow_id).info.status == "RUNNING"  # status changed nothing

        caplog.set_level("WARNING")
        with mlflow_runs.stage_run(load_config(config), "clean"):  # as `tfm stage clean` opens it
            pass
        for run_id in (flow_id, stage_id):
            info = client.get_run(run_id).info
            assert info.status == "KILLED"
            assert info.end_time == last_sign_of_life(load_config(config).root, (flow_id, stage_id))
        for run_id in live_ids:
            assert client.get_run(run_id).info.status == "RUNNING"
        assert any(f"({flow_id}) was killed" in r.getMessage() for r in caplog.records)
        (said,) = status_lines(config, capsys)
        assert f"({flow_id}) was killed" in said and "were ended as KILLED at" in said
    finally:
        live.kill()
        live.wait()


def last_sign_of_life(root: Path, run_ids: tuple[str, ...]) -> int:
    """When the killed process made its last record, in the journals of ``run_ids``."""
    found = [j for j in journals(root) if j.state().run_id in run_ids]
    assert len(found) == len(run_ids)
    return max(r["t"] for j in found for r in j.records() if r["kind"] != "status")
