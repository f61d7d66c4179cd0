"""Elastic training on a Ray test cluster (``ray.cluster_utils.Cluster``, one raylet per node):
``num_workers: [1, 2]`` starts with a worker on each of two nodes, continues on one when a node
is lost and grows back to two when a node joins (each resize restarts the worker group from the
latest checkpoint). Every step is the same two micro-batches whatever the worker count, so the
run consumes the batch sequence of a fixed two-worker run, step for step, and its loss trace
matches that run's to float tolerance (dropout off: masks are drawn per rank, so they differ
between worker counts; the gradient sums add the same terms in another order)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.ray_cluster import local_cluster
from helpers.tiny_training import TRACES, make_inputs, tiny_config, traces

from tasks.framework.config import RayConfig
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import run_stage

# Slow (a cluster of four raylets, two Ray Train runs and two resizes, ~2-3 min): `make test-slow`.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 256 target tokens a step of 128-token micro-batches: 2 micro-batches, for 1 worker or 2.
STEPS = 14
SETTINGS = dict(
    steps=STEPS,
    tokens_per_step=256,
    max_tokens_per_batch=128,
    cpus_per_worker=1.0,
    checkpoint_every=1,  # a resize redoes nothing
    eval_every=STEPS,
    keep_checkpoints=2,
    max_failures=3,
    placement_strategy="SPREAD",
    elastic_check_seconds=1.0,
)
LOSS_TOLERANCE = dict(rel=1e-4, abs=1e-6)  # float32 sums in another order, through Adam


@pytest.fixture(scope="module")
def cluster():
    """A head node without CPUs (the driver, Ray Train's controller) and two 1-CPU nodes."""
    with local_cluster(2) as (cluster, nodes):
        yield cluster, nodes


def cluster_config(root: Path, tracking: Path, address: str, **train: object):
    config = tiny_config(root, tracking, **{**SETTINGS, **train})
    return config.replace(model=config.model.replace(dropout=0.0), ray=RayConfig(address=address))


class Record:
    """A Trainer callback: rank 0 writes ``step-<step>-w<world size>`` after every step and
    takes 0.3 s more a step, so the resizes happen mid-run; a lone worker trains 2 steps
    (checkpointed) and then waits, the third step unsaved, until the grown group replaces it."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __call__(self, trainer) -> None:
        if trainer.rank != 0:
            return
        (self.folder / f"step-{trainer.step:03d}-w{trainer.world_size}").write_text("")
        time.sleep(0.3)
        if trainer.world_size == 1 and trainer.step - trainer.start_step >= 3:
            time.sleep(300)  # ended by the resize long before this


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.1)


def worlds(folder: Path) -> list[int]:
    """The worker count of each step rank 0 recorded, in the order the steps ran."""
    files = sorted(folder.glob("step-*"), key=lambda p: p.stat().st_mtime_ns)
    return [int(p.name.rsplit("-w", 1)[1]) for p in files]


def test_two_workers_shrink_to_one_and_grow_back_with_the_fixed_run_s_batches(
    cluster, tmp_path_factory, monkeypatch
):
    import ray.cloudpickle

    # Right after a node is lost Ray Train may still count it and wait for two workers: give
    # up on that after 20 s (default 60) and start the one that fits. Ray Train hands RAY_TRAIN_*
    # variables from the driver to its controller.
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "20")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster, nodes = cluster
    tracking = tmp_path_factory.mktemp("mlflow")

    root = tmp_path_factory.mktemp("fixed")
    fixed_config = cluster_config(  # checkpoints change nothing a step computes
        root, tracking, cluster.address, num_workers=2, checkpoint_every=STEPS
    )
    fixed = traces(fixed_config, run_stage(fixed_config, "train", make_inputs(root)).path)

    root = tmp_path_factory.mktemp("elastic")
    where = root / "steps"
    where.mkdir()
    config = cluster_config(root, tracking, cluster.address, num_workers=[1, 2])
    assert config.train.elastic
    result: dict = {}

    def fit() -> None:
        try:
            result["out"] = run_stage(config, "train", make_inputs(root), callbacks=[Record(where)])
        except BaseException as error:  # re-raised below, in the test's thread
            result["error"] = error

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()
    wait_for(lambda: worlds(where).count(2) >= 3 or "error" in result, "3 steps on 2 workers")
    nodes[1].kill_raylet()  # a node lost: its worker dies with it
    wait_for(lambda: 1 in worlds(where) or "error" in result, "a step on 1 worker")
    cluster.add_node(num_cpus=1)  # a node joins: the group grows back at the next check
    runner.join(timeout=300)
    assert not runner.is_alive(), "training did not finish"
    if "error" in result:
        raise result["error"]

    seen = worlds(where)
    changes = [w for i, w in enumerate(seen) if i == 0 or w != seen[i - 1]]
    assert changes == [2, 1, 2], seen
    out = result["out"].path
    stats = read_manifest(out)["stats"]
    assert stats["step"] == STEPS and stats["world_size"] == 2
    elastic = traces(config, out)
    assert sorted(elastic["loss"]) == list(range(1, STEPS + 1))
    for key in ("lr", "epoch", "batch_index"):  # the same data position after every step
        assert elastic[key] == fixed[key], key
    for key in set(TRACES) - {"lr", "epoch", "batch_index"}:
        for step, value in fixed[key].items():
            assert elastic[key][step] == pytest.approx(value, **LOSS_TOLERANCE), (key, step)
