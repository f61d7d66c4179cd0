"""Training across nodes: a Ray cluster of several raylets on this machine
(``ray.cluster_utils.Cluster``), one training worker on each of two nodes (``placement_strategy:
SPREAD``), checkpoints in a storage path every node sees. Killing one node's raylet mid-run
kills its worker; Ray Train restarts the worker group on the nodes left, from the latest
checkpoint, and the run ends with the weights and the loss trace of an uninterrupted run, bit
for bit (CPU, same seed, dropout on)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers.callbacks import WhereAndStop, by_value
from helpers.ray_cluster import local_cluster
from helpers.tiny_training import (
    assert_same_weights,
    final_weights,
    make_inputs,
    tiny_config,
    traces,
)

from tasks.framework.config import RayConfig
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import run_stage
from tasks.framework.stage_fingerprint import input_fingerprints
from tasks.framework.workdir import open_workdir

# Slow (a cluster of four raylets and two Ray Train runs, ~2 min): `make test-slow`.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = dict(steps=12, checkpoint_every=3, eval_every=6, placement_strategy="SPREAD")
KILL_AT = 8  # the worker on the second node stops after step 8; step 6 is the last checkpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head node without CPUs (the driver and Ray Train's controller) and three 1-CPU nodes:
    two for the workers and a spare for after one is lost (nodes cannot be added from a thread)."""
    with local_cluster(3) as (cluster, nodes):
        yield cluster, nodes


def cluster_config(root: Path, tracking: Path, address: str, **train: object):
    """The tiny run on the cluster: 2 workers of 0.5 CPU, checkpoints in ``root/shared``."""
    config = tiny_config(root, tracking, storage_path=str(root / "shared"), **STEPS, **train)
    return config.replace(ray=RayConfig(address=address))


def kill_when_stopped(workers, folder: Path, run_dir: Path, done: threading.Event) -> list[str]:
    """In a thread: once a worker has stopped and Ray Train has registered the step-6
    checkpoint, kill the stopped worker's raylet; the node ids killed.

    Ray Train counts a checkpoint once its controller has collected every rank's report (it
    polls the workers every 2 s): a node lost before that takes its rank's report with it, and
    the run resumes from the checkpoint before. Waiting for the controller's snapshot to list
    step 6 makes the resume point certain."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    killed: list[str] = []
    snapshot = run_dir / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    def registered() -> bool:
        return snapshot.is_file() and "step-000000006" in snapshot.read_text()

    def watch() -> None:
        marker = folder / "stopped"
        while not (marker.exists() and registered()) and not done.is_set():
            time.sleep(0.1)
        if done.is_set():
            return
        node_id = marker.read_text()
        node = next(n for n in workers if n.node_id == node_id)
        node.kill_raylet()  # its worker processes die with it
        killed.append(node_id)

    threading.Thread(target=watch, daemon=True).start()
    return killed


def test_a_lost_node_resumes_on_the_cluster_and_ends_bit_identical(cluster, tmp_path_factory):
    from tasks import train

    cluster, workers = cluster
    tracking = tmp_path_factory.mktemp("mlflow")

    root = tmp_path_factory.mktemp("uninterrupted")
    config = cluster_config(root, tracking, cluster.address)
    uninterrupted = run_stage(config, "train", make_inputs(root)).path
    expected_trace, expected_weights = traces(config, uninterrupted), final_weights(uninterrupted)

    root = tmp_path_factory.mktemp("interrupted")
    where = root / "where"
    where.mkdir()
    config = cluster_config(root, tracking, cluster.address, max_failures=1)
    inputs = make_inputs(root)
    storage, name = train.storage_location(config, input_fingerprints(inputs), open_workdir(config))
    run_dir = Path(storage.child(name).path)
    done = threading.Event()
    killed = kill_when_stopped(workers, where, run_dir, done)
    try:
        out = run_stage(
            config, "train", inputs, callbacks=by_value(WhereAndStop(where, KILL_AT))
        ).path
    finally:
        done.set()

    assert killed == [(where / "stopped").read_text()]
    first = [p.read_text() for p in where.glob("node-0-*")]
    assert len(first) == 2 and len(set(first)) == 2  # the two workers ran on two nodes
    resumed = [p.read_text() for p in where.glob("node-6-*")]
    assert len(resumed) == 2 and killed[0] not in resumed  # restarted on the nodes left
    stats = read_manifest(out)["stats"]
    assert stats["resumed_from_step"] == 6 and stats["step"] == 12
    assert Path(stats["ray_run_dir"]).is_relative_to(root / "shared")
    assert_same_weights(final_weights(out), expected_weights)
    assert traces(config, out) == expected_trace
