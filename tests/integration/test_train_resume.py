"""Resume is exact: after a worker failure (Ray Train restarts the workers), after a clean stop
and after a crash, training continues at the next step with the next batch and ends with the
weights and the loss trace of an uninterrupted run (CPU, same seed, dropout on).

Failures are injected by a Trainer callback defined here (``FailOnce``), handed to the workers
through ``run_stage(config, "train", inputs, callbacks=...)`` (``tasks.train.build``'s
``callbacks``): nothing in the config or the training code knows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.tiny_training import (
    assert_same_weights,
    final_weights,
    make_inputs,
    tiny_config,
    traces,
)

from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage

# Slow (three Ray Train runs, ~2 min): `make test-slow`, which CI runs too. The default suite
# checks the same resume arithmetic without Ray in tests/unit/test_trainer.py.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = dict(steps=12, checkpoint_every=3, eval_every=6)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One MLflow database for the module (creating one costs seconds)."""
    return tmp_path_factory.mktemp("mlflow")


class FailOnce:
    """A Trainer callback: the last worker raises after step ``step`` unless ``marker`` exists,
    which it writes first, so Ray Train's restart (or a rerun) gets past it."""

    def __init__(self, step: int, marker: Path):
        self.step, self.marker = step, marker

    def __call__(self, trainer) -> None:
        if trainer.step != self.step or trainer.rank != trainer.world_size - 1:
            return
        if self.marker.exists():
            return
        self.marker.write_text("failed once\n")
        raise RuntimeError(f"injected worker failure at step {self.step} (test callback)")


def fail_once(step: int, marker: Path) -> list[FailOnce]:
    """``[FailOnce(step, marker)]``, pickled by value: Ray's workers cannot import this module."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return [FailOnce(step, marker)]


@pytest.fixture(scope="module")
def baseline(ray_local, tracking, tmp_path_factory):

    root = tmp_path_factory.mktemp("baseline")
    config = tiny_config(root, tracking, **STEPS)
    out = run_stage(config, "train", make_inputs(root)).path
    return traces(config, out), final_weights(out)


def test_worker_failure_restarts_from_last_checkpoint(baseline, tracking, tmp_path):

    config = tiny_config(tmp_path, tracking, max_failures=1, **STEPS)
    marker = tmp_path / "failed-at-step-8"
    out = run_stage(config, "train", make_inputs(tmp_path), callbacks=fail_once(8, marker)).path
    stats = read_manifest(out)["stats"]
    assert stats["resumed_from_step"] == 6  # the restarted workers began at the step-6 checkpoint
    assert marker.is_file()
    assert_same_weights(final_weights(out), baseline[1])
    assert traces(config, out) == baseline[0]


def test_stop_then_rerun_continues_at_the_next_batch(baseline, tracking, tmp_path, capfd):
    import time

    inputs = make_inputs(tmp_path)
    stopped = tiny_config(tmp_path, tracking, stop_after=5, **STEPS)
    out = run_stage(stopped, "train", inputs).path
    stats = read_manifest(out)["stats"]
    assert stats["step"] == 5 and not stats["complete"]
    listing = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    assert [c["step"] for c in listing] == [3, 5]

    config = tiny_config(tmp_path, tracking, **STEPS)  # the same run, without the stop
    out = run_stage(config, "train", inputs).path
    stats = read_manifest(out)["stats"]
    assert stats["resumed_from_step"] == 5 and stats["complete"] and stats["step"] == 12
    console = ""
    for _ in range(20):  # the workers' lines reach the driver's console asynchronously
        console += "".join(capfd.readouterr())
        if "train resuming from step 5/12" in console:
            break
        time.sleep(0.5)
    assert "train resuming from step 5/12" in console
    trace = traces(config, out)
    assert sorted(trace["loss"]) == list(range(1, 13))  # one MLflow run across both parts
    assert trace == baseline[0]  # same losses and same data positions, step by step
    assert_same_weights(final_weights(out), baseline[1])


@pytest.mark.slow
def test_crash_then_rerun_of_the_same_config_resumes(baseline, tracking, tmp_path):

    inputs = make_inputs(tmp_path)
    config = tiny_config(tmp_path, tracking, max_failures=0, **STEPS)
    callbacks = fail_once(8, tmp_path / "failed-at-step-8")
    with pytest.raises(StageError, match="rerun the same config"):
        run_stage(config, "train", inputs, callbacks=callbacks)
    assert not (tmp_path / "train").exists()
    out = run_stage(config, "train", inputs, callbacks=callbacks).path  # it fails only once
    assert read_manifest(out)["stats"]["resumed_from_step"] == 6
    assert_same_weights(final_weights(out), baseline[1])
    assert traces(config, out) == baseline[0]


class SlowRank0:
    """A Trainer callback: rank 0 sleeps ``seconds`` after every step, so only its clock runs
    late enough for the time trigger; the other ranks must follow its decision."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, trainer) -> None:
        import time

        if trainer.rank == 0:
            time.sleep(self.seconds)


def test_time_trigger_checkpoints_every_rank_on_rank_0s_clock(tracking, tmp_path):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # No step trigger; 0.6 s between checkpoints, rank 0 taking 0.25 s more a step than rank 1.
    config = tiny_config(
        tmp_path, tracking, steps=12, eval_every=12, checkpoint_every=0, checkpoint_minutes=0.01
    )
    out = run_stage(config, "train", make_inputs(tmp_path), callbacks=[SlowRank0(0.25)]).path
    listing = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    steps = [c["step"] for c in listing]
    assert steps[-1] == 12 and len(steps) >= 3, steps  # saved on time, not only at the end
    times = [c["time"] for c in listing]
    assert all(b - a >= 0.6 for a, b in zip(times[:-2], times[1:-1], strict=True)), times
    for entry in listing:  # every rank reported each checkpoint (else report() never returns)
        names = {p.name for p in Path(entry["source"]).iterdir()}
        assert {"model.pt", "rng-rank-00000.pt", "rng-rank-00001.pt"} <= names, names
