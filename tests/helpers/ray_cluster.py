"""Ray's multi-node test cluster (``ray.cluster_utils.Cluster``) as the cluster tests use it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def local_cluster(workers: int) -> Iterator[tuple[Any, list[Any]]]:
    """A head node without CPUs (the driver and Ray Train's controller) and ``workers`` 1-CPU
    nodes, this process connected to it; shut down on exit, however it exits."""
    import ray
    from ray.cluster_utils import Cluster

    # The session's local Ray (conftest.ray_local) goes while the cluster is up: a driver joins
    # one cluster at a time. It is back after it, as the tests after this one were promised.
    ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            # A dead raylet is noticed in about 2 s instead of 15 (the default checks).
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(workers)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        start_local_ray()


def start_local_ray() -> None:
    """The session's local 2-CPU Ray, started as a command's stages start it (``ensure_ray``,
    with the switches ``tfm`` sets: its workers know where its State API is)."""
    from pipelines import environment
    from tasks.framework.config import RayConfig
    from tasks.framework.runtime import ensure_ray

    with environment.local_ray(RayConfig(num_cpus=2)) as config:
        ensure_ray(config)
