"""``serving.mlflow_uris.pointed_at``: MLflow's fluent URIs for a block, then as they were."""

from __future__ import annotations

import os

import pytest

from serving.mlflow_uris import pointed_at

TEAM = "http://127.0.0.1:5000"
HERE = "sqlite:////tmp/a-work-dir/mlflow.db"


@pytest.fixture
def team_server(monkeypatch):
    """A process started with a team server and no registry URI of its own."""
    import mlflow

    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    mlflow.set_tracking_uri(TEAM)
    yield
    mlflow.set_tracking_uri(None)


def test_the_block_sees_the_uri_and_the_process_gets_its_own_back(team_server):
    import mlflow

    with pointed_at(HERE):
        assert (mlflow.get_tracking_uri(), mlflow.get_registry_uri()) == (HERE, HERE)
        assert os.environ["MLFLOW_TRACKING_URI"] == HERE  # what a subprocess of the block inherits
    assert os.environ["MLFLOW_TRACKING_URI"] == TEAM and mlflow.get_tracking_uri() == TEAM
    assert "MLFLOW_REGISTRY_URI" not in os.environ


def test_an_error_in_the_block_puts_them_back_too(team_server):
    with pytest.raises(RuntimeError), pointed_at(HERE):
        raise RuntimeError("the model did not load")
    assert os.environ["MLFLOW_TRACKING_URI"] == TEAM
    assert "MLFLOW_REGISTRY_URI" not in os.environ


def test_a_process_without_a_server_is_left_without_one(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    with pointed_at(HERE):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


def test_no_uri_changes_nothing(team_server):
    import mlflow

    with pointed_at(None):
        assert mlflow.get_tracking_uri() == TEAM
    assert os.environ["MLFLOW_TRACKING_URI"] == TEAM
