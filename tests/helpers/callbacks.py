"""Trainer callbacks that tests hand to training's workers (``tasks.train.build``'s
``callbacks``): where each rank ran, a rank that stops to be killed with its node, gates that
hold training while a test takes a service away."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def by_value(*callbacks: object) -> list[object]:
    """``callbacks`` as a list that Ray pickles by value: its workers cannot import tests'
    modules (``tests/`` is not on their path)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return list(callbacks)


class WhereAndStop:
    """Every rank writes its node id after its first step of an attempt
    (``node-<start step>-<rank>``), and the last rank, the first time it reaches ``kill_at``,
    writes ``stopped`` (its node id) and waits there to be killed with its node."""

    def __init__(self, folder: Path, kill_at: int):
        self.folder = folder
        self.kill_at = kill_at

    def __call__(self, trainer) -> None:
        import ray

        node = ray.get_runtime_context().get_node_id()
        if trainer.step == trainer.start_step + 1:
            (self.folder / f"node-{trainer.start_step}-{trainer.rank}").write_text(node)
        last = trainer.rank == trainer.world_size - 1
        if trainer.step == self.kill_at and last and not (self.folder / "stopped").exists():
            (self.folder / "stopped").write_text(node)
            time.sleep(600)  # killed with the node long before this ends


class StopAndSayWhere(WhereAndStop):
    """``WhereAndStop``, and every rank's pid (``pid-<start step>-<rank>``): the network-namespace
    hosts share this machine's pid namespace, so a pid names the host."""

    def __call__(self, trainer) -> None:
        if trainer.step == trainer.start_step + 1:
            (self.folder / f"pid-{trainer.start_step}-{trainer.rank}").write_text(str(os.getpid()))
        super().__call__(trainer)


class Gates:
    """Rank 0 says it reached each step of ``gates`` (``at-<step>``) and waits there until the
    test writes the file the step names (the other ranks wait for it in the next all-reduce)."""

    def __init__(self, folder: Path, gates: dict[int, str]):
        self.folder, self.gates = folder, gates

    def __call__(self, trainer) -> None:
        name = self.gates.get(trainer.step)
        if trainer.rank != 0 or name is None:
            return
        (self.folder / f"at-{trainer.step}").write_text(str(time.time()))
        deadline = time.time() + 900
        while not (self.folder / name).exists() and time.time() < deadline:
            time.sleep(0.1)
