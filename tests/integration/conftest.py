"""Fixtures the integration tests share: a local Ray and Prefect's test harness, per module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """A local 2-CPU Ray started as the stages start it (``ensure_ray``), shut down after."""
    import ray

    from tasks.config import RayConfig
    from tasks.runtime import ensure_ray

    ensure_ray(RayConfig(num_cpus=2))
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def harness():
    """Prefect's test harness: a temporary API server and database for the module's flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
