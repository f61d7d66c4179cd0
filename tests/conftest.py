"""Test-wide settings."""

from __future__ import annotations

import os

import pytest
from helpers.shared_data import require_shared_data


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread: on small shared CI machines torch's default thread pool is several
    times slower than one thread, and tests check behaviour, not speed."""
    import torch

    torch.set_num_threads(1)
    yield


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "shared_data(path): needs ../shared/data/<path>; skipped without it, failed in CI "
        "(tests/shared_data.py)",
    )
    # Progress bars are for people at a terminal.
    os.environ.setdefault("TQDM_DISABLE", "1")
    # Prefect's telemetry service writes to the test harness's SQLite database from a background
    # task; it has nothing to report from a test and only adds "database is locked" noise.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def pytest_runtest_setup(item):
    """A test marked ``shared_data(path)`` runs only with that sample (``require_shared_data``)."""
    for marker in item.iter_markers("shared_data"):
        require_shared_data(*marker.args)


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_as_found():
    """``MLFLOW_TRACKING_URI`` as the test found it, after it: a test's own
    ``mlflow.set_tracking_uri`` writes the variable (the product's calls put it back:
    ``serving.mlflow_uris``), and a later flow in this process would take it for the team
    server a command finds at its start."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if os.environ.get("MLFLOW_TRACKING_URI") != before:
        import mlflow

        mlflow.set_tracking_uri(before)  # None: MLflow's default again, the variable unset
