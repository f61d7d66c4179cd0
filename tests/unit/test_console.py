"""The console filter and the run log: ours on the console, the libraries' lines in the log."""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from pipelines import console, environment


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "message", None, None)


@pytest.mark.parametrize(
    ("name", "level", "shown"),
    [
        ("tasks.framework.runner", logging.INFO, True),  # our progress lines
        ("training.trainer", logging.WARNING, True),
        ("prefect.task_runs", logging.INFO, True),  # what our stages log through Prefect
        ("ray.data", logging.INFO, False),
        ("py.warnings", logging.WARNING, False),  # a library's UserWarning
        ("mlflow.store.db.utils", logging.INFO, False),
        ("tasksmith", logging.INFO, False),  # a prefix of a name is not the package
        ("ray.data", logging.ERROR, True),  # anyone's errors
    ],
)
def test_the_console_shows_ours_and_errors(name, level, shown):
    assert console.for_console(_record(name, level)) is shown


@pytest.mark.parametrize(
    ("name", "level", "message", "shown"),
    [
        ("prefect.task_runs", logging.INFO, "Finished in state Completed()", False),
        ("prefect.flow_runs", logging.INFO, "Beginning flow run 'x' for flow 'pipeline'", False),
        (
            "prefect.task_runs",
            logging.INFO,
            "Task run failed with ... - Retry 1/2 will start",
            True,
        ),
        # A failed stage: Prefect's three copies of the error that `tfm:`'s line says once.
        ("prefect.task_runs", logging.ERROR, "Finished in state Failed('...')", False),
        ("prefect.flow_runs", logging.ERROR, "Encountered exception during execution: E()", False),
        ("prefect.flow_runs", logging.INFO, "Finished in state Failed('Flow run ...')", False),
        ("prefect.flow_runs", logging.ERROR, "Crash detected! Execution was aborted", False),
        ("prefect.task_runs", logging.ERROR, "Task run failed with exception: E()", False),
        ("prefect.server.api", logging.ERROR, "Finished in state Failed('...')", True),
        ("prefect.task_runs", logging.ERROR, "stage clean: the disk is full", True),
        ("prefect.task_runs", logging.INFO, "stage clean: MLflow run 123", True),
    ],
)
def test_prefects_bookkeeping_goes_to_the_run_log(name, level, message, shown):
    record = logging.LogRecord(name, level, __file__, 1, message, None, None)
    assert console.for_console(record) is shown


def test_a_record_for_the_run_log_only_stays_off_the_console():
    logger = logging.getLogger("pipelines.test_console")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.warning("stage x: ran", extra=console.RUN_LOG_ONLY)
        logger.warning("stage x: done")
    finally:
        logger.removeHandler(handler)
    assert [console.for_console(r) for r in records] == [False, True]


def test_rays_worker_prefix_is_off_unless_verbose(monkeypatch, clean_logging):
    for name in console.QUIET_RAY:
        monkeypatch.delenv(name, raising=False)
    with environment.started(verbose=False):
        assert os.environ["RAY_DISABLE_WORKER_LOG_PREFIX"] == "1"
    assert "RAY_DISABLE_WORKER_LOG_PREFIX" not in os.environ
    with environment.started(verbose=True):
        assert "RAY_DISABLE_WORKER_LOG_PREFIX" not in os.environ


def test_ray_trains_own_lines_are_at_warning_unless_verbose(clean_logging):
    from training.ray_trainer import ray_train_log_level

    with console.routed(verbose=False):
        assert ray_train_log_level() == "WARNING"
    with console.routed(verbose=True):
        assert ray_train_log_level() == "INFO"


@pytest.fixture
def clean_logging(monkeypatch):
    """Leave the root and ``ray.data`` loggers and the environment as they were."""
    # Set, then removed: monkeypatch records that it was absent, and removes what logging_to sets.
    monkeypatch.setenv(console.RAY_DATA_CONFIG_VAR, "")
    monkeypatch.delenv(console.RAY_DATA_CONFIG_VAR)
    root, ray_data = logging.getLogger(), logging.getLogger("ray.data")
    saved = (list(root.handlers), list(ray_data.handlers), ray_data.level, ray_data.propagate)
    yield
    for handler in root.handlers + ray_data.handlers:
        if handler not in saved[0] + saved[1]:
            handler.close()
    root.handlers[:], ray_data.handlers[:] = saved[0], saved[1]
    ray_data.setLevel(saved[2])
    ray_data.propagate = saved[3]


def test_ray_data_info_lines_go_to_the_run_log_not_the_console(tmp_path, clean_logging):
    from ray.data._internal.logging import configure_logging

    log = environment.logging_to(tmp_path, verbose=False)
    configure_logging()  # what importing ray.data does, in the driver and in each worker
    logging.getLogger("ray.data.test").info("Execution plan of Dataset x")
    logging.getLogger("ray.data.test").warning("a warning of Ray Data's")
    text = log.read_text(encoding="utf-8")
    assert "Execution plan of Dataset x" in text and "a warning of Ray Data's" in text
    levels = {h.name: h.level for h in logging.getLogger("ray.data").handlers}
    assert levels["console"] == logging.WARNING


def test_verbose_leaves_ray_data_as_it_is(tmp_path, clean_logging):
    environment.logging_to(tmp_path, verbose=True)
    assert console.RAY_DATA_CONFIG_VAR not in os.environ


def test_a_command_leaves_logging_and_the_environment_as_it_found_them(tmp_path, clean_logging):
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    prefects = PrefectConsoleHandler()  # what Prefect's logging setup puts on the root logger
    root.addHandler(prefects)
    handlers, bars = list(root.handlers), os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    try:
        with environment.started(verbose=False), console.routed(verbose=False):
            environment.logging_to(tmp_path, verbose=False)
            assert console.RAY_DATA_CONFIG_VAR in os.environ
            # The console and the run log, in place of Prefect's console handler(s).
            kept = [h for h in handlers if not isinstance(h, PrefectConsoleHandler)]
            assert not any(isinstance(h, PrefectConsoleHandler) for h in root.handlers)
            assert len(root.handlers) == len(kept) + 2
        assert set(root.handlers) == set(handlers)
    finally:
        root.removeHandler(prefects)
    assert console.RAY_DATA_CONFIG_VAR not in os.environ
    assert os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR") == bars


def test_a_loaded_config_sets_mlflows_budget_and_its_local_rays_switches_for_the_command(
    tmp_path, monkeypatch
):
    from tasks.framework import runtime
    from tasks.framework.config import config_from_dict

    for name in ("RAY_ADDRESS", runtime.AUTH_MODE_VAR, runtime.PREEMPTION_WATCHER_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "dashboard_port", lambda: 8300)
    local = config_from_dict({"name": "x", "workdir": str(tmp_path), "mlflow": {"http_timeout": 3}})
    cluster = local.replace(ray=dataclasses.replace(local.ray, address="10.0.0.1:6379"))
    before = dict(os.environ)
    with environment.started(verbose=False):
        assert environment.configured(cluster).ray.dashboard_port is None
        assert os.environ.get(runtime.API_SERVER_VAR) == before.get(runtime.API_SERVER_VAR)
        configured = environment.configured(local)
        assert configured.ray.dashboard_port == 8300
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"
        assert os.environ[runtime.API_SERVER_VAR] == "http://127.0.0.1:8300"
        assert os.environ[runtime.PREEMPTION_WATCHER_VAR] == "0"
        assert os.environ[runtime.AUTH_MODE_VAR] == "token"
    # The command's switches leave with it; Ray's token mode stays, as ray.init leaves it.
    assert {k: v for k, v in os.environ.items() if k != runtime.AUTH_MODE_VAR} == before


def test_a_cluster_gets_token_authentication_only_with_a_token_at_hand(tmp_path, monkeypatch):
    from tasks.framework import runtime
    from tasks.framework.config import RayConfig

    monkeypatch.setattr(runtime, "TOKEN_FILE", tmp_path / "no-token")
    cluster = RayConfig(address="10.0.0.1:6379")
    token = {runtime.AUTH_MODE_VAR: "token"}
    assert runtime.ray_switches(cluster, {}) == (cluster, {})
    assert runtime.ray_switches(RayConfig(), {"RAY_ADDRESS": "auto"})[1] == {}
    assert runtime.ray_switches(cluster, {"RAY_AUTH_TOKEN": "s3cr3t"})[1] == token
    named = tmp_path / "token"
    assert runtime.ray_switches(cluster, {"RAY_AUTH_TOKEN_PATH": str(named)})[1] == {}
    named.write_text("s3cr3t")
    assert runtime.ray_switches(cluster, {"RAY_AUTH_TOKEN_PATH": str(named)})[1] == token
    # The user's own mode stays; the machine's token file counts.
    assert (
        runtime.ray_switches(cluster, {runtime.AUTH_MODE_VAR: "disabled", "RAY_AUTH_TOKEN": "x"})[1]
        == {}
    )
    monkeypatch.setattr(runtime, "TOKEN_FILE", named)
    assert runtime.ray_switches(cluster, {})[1] == token
