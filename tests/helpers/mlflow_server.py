"""A real MLflow tracking server for the tests: ``mlflow server`` on 127.0.0.1 and a free port,
on a SQLite database in a folder of the test's; ``start`` runs the same command every time (the
same port, database and artifacts), ``kill`` ends it and its workers at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 (not started until ``start``)."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--default-artifact-root",
            str(root / "artifacts"),
        ]
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # No job runner (its huey consumers): nothing here runs server-side jobs, and on 2
        # shared cores they slow the server's start.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server did not start: {self.log.read_text()[-2000:]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            os.killpg(self.proc.pid, 9)  # its own session: the server and its workers
            self.proc.wait()
