"""Rank 0's Tracker through a real MLflow server's outage: the server (SQLite in tmp_path, on
127.0.0.1) is killed mid-run for longer than the lowered retry budget and restarted with the
same command; the logging loop never waits on it and every step's metrics end in MLflow once,
in step order."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from training.tracking import Tracker, TrackingOptions
from training.tracking_spill import SPILL_FILE, SpillFile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# One try, no backoff, a 3-s answer: the drain thread sees the outage in seconds.
BUDGET = TrackingOptions(http_retries=1, http_backoff=0, http_timeout=3, queue_size=16,
                         drain_seconds=60, probe_seconds=0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on 127.0.0.1; ``start`` runs the same command every time."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
            "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--default-artifact-root", str(root / "artifacts"),
        ]
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # No job runner (its huey consumers): nothing here runs server-side jobs, and on 2
        # shared cores they slow the server's start.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)  # its own session: the server and its workers
            self.proc.wait()


@pytest.fixture
def server(tmp_path):
    srv = MlflowServer(tmp_path)
    srv.start()
    yield srv
    srv.kill()


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_tracking_outage_loses_nothing_and_never_stops_the_loop(server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    for key, value in BUDGET.http_env().items():  # what the worker sets for rank 0's process
        monkeypatch.setenv(key, value)
    client = MlflowClient(server.uri)
    run_id = client.create_run(client.create_experiment("outage")).info.run_id
    out = io.StringIO()
    spill = SpillFile(tmp_path / "spill" / SPILL_FILE)
    tracker = Tracker(server.uri, run_id, True, spill_dir=spill.path.parent, options=BUDGET,
                      out=out)

    def log(steps) -> None:
        for step in steps:
            tracker.metrics({"loss": 5.0 / step, "tokens_per_s": 1000.0 + step}, step)
            time.sleep(0.02)

    log(range(1, 21))
    server.kill()
    log(range(21, 41))
    # Down for longer than one call's budget: the drain thread has seen it and spills.
    wait_for(lambda: "unreachable" in out.getvalue() and spill.pending(), 60)
    log(range(41, 141))
    assert server.proc.poll() is not None  # the loop went through 120 steps while it was down
    on_disk = [r.metrics[0][3] for r, _ in spill.read(spill.offset())]
    assert on_disk == sorted(on_disk) and on_disk[-1] == 140
    server.start()
    log(range(141, 161))
    assert tracker.close() == 0
    history = MlflowClient(server.uri).get_metric_history(run_id, "loss")
    by_time = [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]
    assert by_time == list(range(1, 161))  # each step once, in step order
    assert len(MlflowClient(server.uri).get_metric_history(run_id, "tokens_per_s")) == 160
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if "unreachable" in line]) == 1
    assert len([line for line in lines if "answers again" in line]) == 1
    assert not spill.path.exists()
