"""When the Trainer checkpoints (every ``checkpoint_minutes`` on rank 0's clock, besides every
``checkpoint_every`` steps) and resuming a checkpoint with another number of workers: the next
step takes the batches the original world would have taken next, and fresh per-rank RNG streams.

Without Ray: the ranks of a world are Trainers with ``rank``/``world_size`` in one process (no
process group, so each trains on its own share). tests/integration/test_train_resume.py runs the
same on real Ray Train workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.trainer import SEED, as_checkpoint, consumed, make_trainer, settings

import training.trainer as trainer_module
from training.distributed import seed_all


class Clock:
    """A stand-in for the ``time`` module the Trainer reads: minutes pass only when told."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += 60 * minutes


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(trainer_module, "time", fake)
    return fake


def saved_steps(trainer, clock: Clock, minutes_per_step: float) -> list[int]:
    """Step to the end, ``minutes_per_step`` passing in each step; the steps checkpointed."""
    saved: list[int] = []
    while not trainer.done:
        trainer.train_step()
        clock.advance(minutes_per_step)
        trainer.maybe_checkpoint(lambda metrics: saved.append(metrics["step"]))
    return saved


def test_checkpoint_minutes_saves_when_that_long_has_passed_since_the_last_save(clock):
    # 4 minutes a step, a checkpoint every 10: after steps 3 (12 min), 6 (12 more), 9, and the last.
    trainer = make_trainer(settings(steps=10, checkpoint_every=0, checkpoint_minutes=10.0))
    assert saved_steps(trainer, clock, 4.0) == [3, 6, 9, 10]


def test_time_and_step_triggers_both_save_and_a_step_save_restarts_the_clock(clock):
    trainer = make_trainer(settings(steps=10, checkpoint_every=4, checkpoint_minutes=10.0))
    # step 3: 12 min (time); 4: step; 7: 12 min after step 4 (time); 8: step; 10: the last.
    assert saved_steps(trainer, clock, 4.0) == [3, 4, 7, 8, 10]


def test_zero_minutes_disables_the_time_trigger(clock):
    trainer = make_trainer(settings(steps=6, checkpoint_every=0, checkpoint_minutes=0.0))
    assert saved_steps(trainer, clock, 60.0) == [6]


def test_only_rank_0s_clock_decides(clock):
    # Rank 1 of 2 (no process group: broadcast_flag returns rank 1's own False) never saves on
    # time, however late: on real workers it gets rank 0's decision, so every rank reports together.
    trainer = make_trainer(
        settings(steps=6, checkpoint_every=0, checkpoint_minutes=10.0), rank=1, world_size=2
    )
    assert saved_steps(trainer, clock, 60.0) == [6]


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_resuming_with_another_number_of_workers_continues_the_same_batch_sequence(before, after):
    # 160 tokens a step of 80-token micro-batches: 2 batches a step with 1 worker (2 accumulated)
    # or with 2 (1 each), so the global sequence of batches is the same for both worlds.
    config = settings(steps=8)
    straight = make_trainer(config, rank=0, world_size=before)
    expected = consumed(straight, 8)

    ranks = [make_trainer(config, rank=r, world_size=before) for r in range(before)]
    for trainer in ranks:
        consumed(trainer, 3)
    state = as_checkpoint(ranks[0].state_dict())
    assert state["world_size"] == before

    resumed = [make_trainer(config, init_seed=999, rank=r, world_size=after) for r in range(after)]
    for r, trainer in enumerate(resumed):
        trainer.load_state_dict(state)
        assert trainer.step == trainer.start_step == 3
        assert trainer.per_step == ranks[0].per_step == 2
        # Another world: the RNG states are derived afresh from (seed + step, rank), not restored.
        rng = torch.get_rng_state()
        seed_all(SEED + 3, r)
        assert torch.equal(rng, torch.get_rng_state())
        for name, value in trainer.module.state_dict().items():
            torch.testing.assert_close(value, ranks[0].module.state_dict()[name], rtol=0, atol=0)
    after_resume = consumed(resumed[0], 5)
    for trainer in resumed[1:]:
        assert all(
            np.array_equal(a, b) for a, b in zip(consumed(trainer, 5), after_resume, strict=True)
        )
    assert len(after_resume) == len(expected) - 6
    assert all(np.array_equal(a, b) for a, b in zip(after_resume, expected[6:], strict=True))
