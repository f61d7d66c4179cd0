"""Whole flows (the tiny synthetic WMT14 config of test_flow) against a real MLflow server
(``mlflow server`` on 127.0.0.1 and a free port, SQLite) that is down when they start, or that
dies between two stages: every stage runs, the console says once that the server does not
answer and once that it answers again (or, in the next command, that it sends what the last one
kept), and once it is back MLflow holds every stage's run,
every record once and in order, and the registered version. Only register needs the server:
it fails in one line naming it, and a rerun registers without training again."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from helpers.flow_configs import WMT14_STAGES, ran, tiny_config, write_config
from helpers.mlflow_server import MlflowServer

from tasks.framework.config import RunConfig
from tracking.journal import REJECTED, journals

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 30
OUTAGE = {"http_retries": 0, "http_timeout": 3, "probe_seconds": 0.5, "drain_seconds": 120}
"""The sender's budget in these flows: one try, a 3-s answer, a probe every half second."""


def flow_config(tmp_path: Path, server: MlflowServer, name: str, **more) -> str:
    overrides = {
        "mlflow.tracking_uri": server.uri,
        "mlflow.experiment": name,
        **{f"mlflow.{k}": v for k, v in OUTAGE.items()},
        "train.steps": STEPS,
        "train.log_every": 1,
        "train.eval_every": 10,
        "train.checkpoint_every": 10,
        "register.model_name": name,
        **more,
    }
    return write_config(tmp_path / f"{name}.yaml", tiny_config(tmp_path, **overrides))


class Said(logging.Handler):
    """The lines our loggers say (the tracking lines, the runner's stage lines), in order."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def tracking(self) -> list[str]:
        """What the lines said of the server: ``down`` (it does not answer), ``back`` (it
        answers again), ``earlier`` (a command sends what an earlier one kept)."""
        words = {"is unreachable": "down", "answers again": "back", "an earlier command": "earlier"}
        return [word for line in self.lines for phrase, word in words.items() if phrase in line]


@contextlib.contextmanager
def said():
    handler = Said()
    loggers = [logging.getLogger(name) for name in ("tracking", "tasks.framework")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def when(condition, action, seconds: float = 900) -> threading.Thread:
    """``action()`` in a thread as soon as ``condition()`` holds."""

    def watch():
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.2)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def losses_in_journal(root: Path) -> int:
    """The ``loss`` records training has logged so far (into its run's journal)."""
    for journal in journals(root):
        opened = next(journal.records("open"), None)
        if opened is not None and opened["name"].endswith("/train"):
            return sum(m[0] == "loss" for r in journal.records("log") for m in r.get("metrics", ()))
    return 0


def check_mlflow(config, server: MlflowServer, flows: int) -> dict:
    """What MLflow holds of ``flows`` flow runs of ``config``: a parent run each, a run per
    stage under the first, every training step's metrics once and in order, each stage's
    result and manifest, the champion; nothing left in a journal, nothing refused."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.uri, registry_uri=server.uri)
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    parents = sorted(
        (r for r in runs if r.data.tags.get("pipeline") == "wmt14"), key=lambda r: r.info.start_time
    )
    assert len(parents) == flows
    children = {
        p.info.run_id: {
            r.data.tags["stage"]: r
            for r in runs
            if r.data.tags.get("mlflow.parentRunId") == p.info.run_id
        }
        for p in parents
    }
    first = children[parents[0].info.run_id]
    assert sorted(first) == sorted(WMT14_STAGES)
    assert len(parents[0].data.params) > 50  # the whole config
    for stage, run in first.items():
        if run.info.status == "FAILED":  # its stage failed: no result to log
            continue
        assert run.info.status == "FINISHED", stage
        assert run.data.tags["fingerprint"] and run.data.tags["skipped"] == "false", stage
        assert f"{stage}/manifest.json" in {
            a.path for a in client.list_artifacts(run.info.run_id, stage)
        }
    train = first["train"].info.run_id
    for key in ("loss", "lr"):
        history = sorted(client.get_metric_history(train, key), key=lambda m: (m.timestamp, m.step))
        assert [m.step for m in history] == list(range(1, STEPS + 1)), key
    assert sorted(m.step for m in client.get_metric_history(train, "val_loss")) == [10, 20, 30]
    assert {"learning_curve.png", "config.json"} <= {a.path for a in client.list_artifacts(train)}
    champion = client.get_model_version_by_alias(config.register.model_name, "champion")
    registered = [c["register"] for c in children.values() if "register" in c]
    assert champion.run_id == registered[-1].info.run_id
    left = [
        j.folder for j in journals(config.root) if j.pending() or (j.folder / REJECTED).exists()
    ]
    assert left == []
    return {"parents": parents, "children": children}


def loaded(path: str, monkeypatch) -> RunConfig:
    """The config at ``path``, with the MLflow HTTP budget a command sets for it
    (``pipelines.environment.configured``), for this test: what it sets, as a deployment's run
    does, goes with the test too."""
    from pipelines import environment
    from tasks.framework import mlflow_runs
    from tasks.framework.config import load_config

    for name in environment.COMMAND_VARIABLES:  # recorded as they are, restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
        if not os.environ[name]:
            monkeypatch.delenv(name)
    config = load_config(path)
    for name, value in mlflow_runs.http_environment(config).items():
        monkeypatch.setenv(name, value)
    return config


@pytest.mark.timeout(1800)
def test_a_flow_started_while_the_server_is_down_runs_and_mlflow_gets_everything_once(
    tmp_path, harness, ray_local, monkeypatch
):
    """The server is down when the flow starts and is started mid-training."""
    from pipelines.flows import Loaded, pipeline_flow

    server = MlflowServer(tmp_path / "server")
    path = flow_config(tmp_path, server, "started-down")
    config = loaded(path, monkeypatch)
    try:
        with said() as lines:
            starter = when(lambda: losses_in_journal(config.root) >= 5, server.start)
            outcomes = pipeline_flow(config_path=path, loaded=Loaded(config))
            starter.join()
        assert ran(outcomes) == WMT14_STAGES
        # It said so once, while the stages went on (the server is started only once training
        # has logged), and once when it answered.
        assert lines.tracking() == ["down", "back"], lines.lines
        check_mlflow(config, server, flows=1)
    finally:
        server.kill()


@pytest.mark.timeout(1800)
def test_a_server_killed_between_two_stages_fails_only_register_and_a_rerun_registers(
    tmp_path, harness, ray_local, monkeypatch
):
    """The server dies after clean and stays down: every stage through score runs and register
    fails in one line naming it; once it is back, the journals reach it and a rerun registers
    without running any other stage."""
    from pipelines.cli import error_line
    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.results import StageError

    server = MlflowServer(tmp_path / "server")
    server.start()
    path = flow_config(tmp_path, server, "killed", **{"mlflow.registry_wait_seconds": 5})
    config = loaded(path, monkeypatch)
    try:
        with said() as lines:
            killer = when(lambda: (config.root / "clean" / "manifest.json").exists(), server.kill)
            with pytest.raises(StageError) as failed:
                pipeline_flow(config_path=path, loaded=Loaded(config))
            killer.join()
            line = error_line(failed.value)
            assert "stage register failed" in line and server.uri in line and "\n" not in line
            for stage in WMT14_STAGES[:-1]:
                assert (config.root / stage / "manifest.json").is_file(), stage
            server.start()
            outcomes = pipeline_flow(config_path=path)
        assert ran(outcomes) == ["register"]
        # The first command said once that the server does not answer; the rerun, a command of
        # its own, that it sends first what the first one kept.
        assert lines.tracking() == ["down", "earlier"], lines.lines
        held = check_mlflow(config, server, flows=2)
        first, second = held["parents"]
        assert first.info.status == "FAILED" and second.info.status == "FINISHED"
        assert held["children"][first.info.run_id]["register"].info.status == "FAILED"
    finally:
        server.kill()
