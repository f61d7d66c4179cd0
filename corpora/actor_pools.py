"""What the Ray Data actor pools (the shard stage's encoders, the decode stages' translators)
are given beside their work: whether Ray restarts an actor it lost."""

from __future__ import annotations

__all__ = ["max_restarts"]

RAY_DATA_DEFAULT = -1
"""Ray Data's own ``max_restarts`` for a pool actor (ray 2.60): restart it, with no limit, and
retry its batch."""


def max_restarts() -> int:
    """``max_restarts`` for an actor pool's ``map_batches`` (Ray must be running): 0 on one
    node, Ray Data's default on more.

    A restart is for a lost node. On one node (a local Ray, the quickstart) that node is the
    driver's too, and an actor is lost only when its process is killed or crashes: the stage
    fails, naming the error, and its rerun starts it over. Ray Data hands every pool actor its
    transform through the object store, which with restarts on has Ray Core print an ERROR line
    that a restart may fail (ray 2.60, ray-project/ray#53727), on every run."""
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return 0 if nodes <= 1 else RAY_DATA_DEFAULT
