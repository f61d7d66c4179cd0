"""MLflow's fluent API pointed at one server for a block, then put back as it was.

``mlflow.set_tracking_uri`` / ``set_registry_uri`` change process-wide state and MLflow mirrors
them into ``MLFLOW_TRACKING_URI`` / ``MLFLOW_REGISTRY_URI`` for subprocesses: a process that
registered or loaded a model and then ran another command (a deployment's worker, a notebook,
the test suite) took the last server for the team server it was started with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast


@contextlib.contextmanager
def pointed_at(uri: str | None) -> Iterator[None]:
    """The fluent tracking and registry URIs are ``uri`` in the block (as they are, when
    ``None``); after it, what they were, the environment variables included."""
    if not uri:
        yield
        return
    import mlflow
    from mlflow.environment_variables import MLFLOW_REGISTRY_URI, MLFLOW_TRACKING_URI

    tracking, registry = MLFLOW_TRACKING_URI.get_raw(), MLFLOW_REGISTRY_URI.get_raw()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        # MLflow 3.17 annotates str and takes None as "none set": tracking's unsets the variable,
        # registry's leaves it.
        mlflow.set_tracking_uri(cast(str, tracking))
        mlflow.set_registry_uri(cast(str, registry))
        if registry is None:
            MLFLOW_REGISTRY_URI.unset()
