"""Which checkpoints the average stage picks: the last N by step, or N spaced in time."""

from __future__ import annotations

import pytest

from tasks.average import pick_checkpoints


def entries(pairs):
    return [{"step": s, "time": t, "path": f"checkpoints/step-{s:09d}/model.pt"} for s, t in pairs]


def steps(picked):
    return [e["step"] for e in picked]


def test_by_step_takes_the_highest_steps_in_order():
    listing = entries([(3000, 30), (1000, 10), (5000, 50), (2000, 20), (4000, 40)])
    assert steps(pick_checkpoints(listing, 3, "step")) == [3000, 4000, 5000]


def test_by_step_with_fewer_than_asked_takes_all():
    listing = entries([(2, 2.0), (1, 1.0)])
    assert steps(pick_checkpoints(listing, 5, "step")) == [1, 2]


def test_by_time_skips_checkpoints_closer_than_the_spacing():
    # Time-triggered checkpoints every 600 s plus step-triggered ones in between.
    listing = entries(
        [(100, 0), (150, 300), (200, 600), (250, 900), (300, 1200), (320, 1290), (350, 1500)]
    )
    # Newest 350 @1500; then 250 @900 (>= 600 s older than 1500; 300 @1200 and 320 @1290 are
    # too close); then 150 @300 (200 @600 is only 300 s older than 900).
    assert steps(pick_checkpoints(listing, 3, "time", minutes=10)) == [150, 250, 350]
    assert steps(pick_checkpoints(listing, 5, "time", minutes=10)) == [150, 250, 350]
    assert steps(pick_checkpoints(listing, 2, "time", minutes=5)) == [300, 350]


def test_by_time_with_zero_spacing_equals_by_step():
    listing = entries([(s, float(s)) for s in range(1, 11)])
    assert pick_checkpoints(listing, 4, "time", minutes=0) == pick_checkpoints(listing, 4, "step")


def test_by_time_uses_the_exact_boundary():
    listing = entries([(1, 0.0), (2, 599.0), (3, 600.0), (4, 1200.0)])
    assert steps(pick_checkpoints(listing, 5, "time", minutes=10)) == [1, 3, 4]


def test_bad_arguments():
    listing = entries([(1, 0.0)])
    with pytest.raises(ValueError, match="last"):
        pick_checkpoints(listing, 0, "step")
    with pytest.raises(ValueError, match="spacing"):
        pick_checkpoints(listing, 1, "hourly")
