"""The pipeline run as a team runs it, across separate hosts (network namespaces on this machine,
infra/local-cluster/localcluster.py): a Prefect server and a process worker, a Ray cluster with
token authentication, an MLflow server on PostgreSQL with proxied artifacts. The cluster comes up
once for the package's tests and goes down after its last.

The tests run in the order of their files' names, which is the scenario's: a dead worker host
(test_dead_host.py), the work dir in a bucket (test_no_shared_disk.py), the services stopped
mid-training one after another in one flow run (test_outages.py), the object store's keys
(test_s3_store.py). Each brings back the host or services it stops, so none needs another's
results; the order is kept so that the first run meets a fresh cluster, as the times measured in
docs/local-cluster.md assume. A flow run's process is ``helpers.scenario_flow`` (Prefect's engine
with a callback on training's steps), which the worker runs from the tests folder.
"""

from __future__ import annotations

import time

import pytest
from helpers.netns_cluster import local_cluster, require_hosts


@pytest.fixture(scope="package")
def cluster():
    require_hosts()
    started = time.time()
    with local_cluster("tfmtest", "10.204.0.0/24") as c:
        c.timings = {"up": time.time() - started}  # type: ignore[attr-defined]
        yield c
