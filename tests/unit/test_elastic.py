"""Elastic workers (``train.num_workers: [min, max]``): a step is the same micro-batches whatever
the worker count (dealt round-robin, uneven when the count does not divide them), so a run
resized from one checkpoint to the next consumes the batch sequence of a fixed-size run.

Without Ray (ranks are Trainers in one process); tests/integration/test_elastic_resize.py resizes
real Ray Train worker groups."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.trainer import as_checkpoint, consumed, make_trainer, settings

from tasks.framework.config import config_from_dict
from transformer_core.config_checks import ConfigError

# 240 target tokens a step of 80-token micro-batches: 3 micro-batches, for 1, 2 or 3 workers.
ELASTIC = dict(tokens_per_step=240, max_tokens_per_batch=80, num_workers=(1, 3))


def test_num_workers_takes_a_min_max_range_from_yaml():
    config = config_from_dict(
        {"name": "t", "train": {"num_workers": [1, 4], "tokens_per_step": 25000}}
    )
    tc = config.train
    assert tc.num_workers == (1, 4) and tc.elastic and (tc.min_workers, tc.max_workers) == (1, 4)
    assert tc.batches_per_step(1) == tc.batches_per_step(4) == 7  # ceil(25000 / 4096)
    fixed = config_from_dict({"name": "t", "train": {"num_workers": 4}}).train
    assert not fixed.elastic and fixed.batches_per_step(4) == 8  # 4 workers x 2 accumulated


@pytest.mark.parametrize(
    "workers, message",
    [
        ([2, 1], "min exceeds max"),
        ([0, 2], "must be >= 1"),
        ([1, 8], "at most 7 elastic workers"),
        ([1, 2, 3], "must have 2 items"),
    ],
)
def test_a_bad_range_is_an_error_naming_num_workers(workers, message):
    with pytest.raises(ConfigError, match=message) as error:
        config_from_dict({"name": "t", "train": {"num_workers": workers, "tokens_per_step": 25000}})
    assert "num_workers" in str(error.value)


def test_every_worker_count_takes_the_same_batches_each_step():
    sequences = []
    for world in (1, 2, 3):
        ranks = [make_trainer(settings(**ELASTIC), rank=r, world_size=world) for r in range(world)]
        assert {t.per_step for t in ranks} == {3}
        # the three micro-batches dealt round-robin: 3 on one rank, 2 + 1 on two, 1 each on three
        shares = [len(t.prefetcher.next()[1]) for t in ranks]
        assert shares == {1: [3], 2: [2, 1], 3: [1, 1, 1]}[world]
        sequences.append(consumed(make_trainer(settings(**ELASTIC), world_size=world), 6))
    for other in sequences[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(other, sequences[0], strict=True))


def test_a_fixed_count_that_does_not_divide_the_step_rounds_up_per_worker():
    # The fixed-size behaviour is unchanged: 2 workers x ceil(3 / 2) = 4 micro-batches a step.
    trainer = make_trainer(settings(tokens_per_step=240, max_tokens_per_batch=80), world_size=2)
    assert trainer.per_step == 4 and trainer.accumulation == 2


def test_resizing_from_a_checkpoint_continues_the_batch_sequence():
    expected = consumed(make_trainer(settings(**ELASTIC), world_size=2), 8)
    before = make_trainer(settings(**ELASTIC), world_size=2)
    consumed(before, 3)
    resized = make_trainer(settings(**ELASTIC), init_seed=999, world_size=3)
    resized.load_state_dict(as_checkpoint(before.state_dict()))
    after = consumed(resized, 5)
    assert all(np.array_equal(a, b) for a, b in zip(after, expected[9:], strict=True))
