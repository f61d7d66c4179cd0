"""The throughput meter and the best-checkpoint tracker the Trainer keeps."""

from __future__ import annotations

import pytest

from training.best import BestCheckpoint
from training.throughput import ThroughputMeter


def test_a_reading_covers_the_steps_since_the_last_reading_or_reset():
    meter = ThroughputMeter(world_size=2, peak_flops=4e12)
    meter.add(10.0, tokens=100, targets=40, flops=1e12)
    meter.add(11.0, tokens=300, targets=60, flops=3e12)
    rates = meter.read(14.0, timed=False)  # warm-up: not summed
    assert rates["tokens_per_s"] == 100.0 and rates["tokens_per_s_per_worker"] == 50.0
    assert rates["target_tokens_per_s"] == 25.0
    assert rates["tflops_per_worker"] == pytest.approx(0.5) and rates["mfu"] == pytest.approx(0.125)
    assert (meter.timed_tokens, meter.timed_seconds, meter.tokens_per_s) == (0, 0.0, None)
    assert meter.timed_targets == 0

    meter.add(20.0, tokens=50, targets=10, flops=0.0)
    meter.reset()  # a validation: the interval starts again with the next step
    meter.add(30.0, tokens=80, targets=20, flops=0.0)
    assert meter.read(32.0, timed=True)["tokens_per_s"] == 40.0
    assert (meter.timed_tokens, meter.timed_seconds, meter.tokens_per_s) == (80, 2.0, 40.0)
    assert meter.timed_targets == 20  # the reset interval's 10 targets are not counted


def test_no_peak_no_mfu_and_no_time_no_rates():
    meter = ThroughputMeter(world_size=1, peak_flops=None)
    meter.add(5.0, tokens=10, targets=5, flops=1.0)
    rates = meter.read(5.0, timed=True)
    assert rates["mfu"] is None and rates["tokens_per_s"] == 0.0


def test_best_keeps_the_first_of_equal_scores_and_runs_out_of_patience():
    best = BestCheckpoint(patience=2)
    assert best.update(4, 10.0) and best.record == {"step": 4, "val_bleu": 10.0}
    assert not best.update(8, 10.0) and best.record["step"] == 4 and not best.improved
    assert best.since_best == 1 and not best.out_of_patience
    assert not best.update(12, 3.0) and best.out_of_patience
    resumed = BestCheckpoint(patience=2)
    resumed.load_state_dict(best.state_dict())
    assert resumed.record == best.record and resumed.out_of_patience
    assert best.update(16, 11.0) and not best.out_of_patience
    assert not BestCheckpoint(patience=None).out_of_patience
    fresh = BestCheckpoint(patience=None)
    fresh.load_state_dict({})  # a checkpoint from before any validation
    assert fresh.record == {} and fresh.since_best == 0
