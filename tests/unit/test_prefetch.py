"""The Prefetcher owns the batch stream: the steps it hands out, ahead in a thread or not, are the
seeded stream's, and its position is where a resume continues exactly."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.trainer import SEED, reversal

from training.data import BatchStream
from training.prefetch import Prefetcher

PER_STEP = 3


def prefetcher(depth: int, **position: int) -> Prefetcher:
    data = reversal(96, 1)
    stream = BatchStream(data, 80, SEED, **position)
    return Prefetcher(
        stream,
        per_step=PER_STEP,
        mine=slice(1, None, 2),  # rank 1 of 2
        collate=lambda rows: data.batch(rows, 0, 2),
        depth=depth,
        pin=False,
    )


def steps(feed: Prefetcher, n: int) -> list[tuple[list[np.ndarray], dict[str, int]]]:
    out = []
    for _ in range(n):
        batches, host = feed.next()
        assert len(host) == len(batches[1::2])
        out.append((batches, dict(feed.position)))
    return out


def same(a, b) -> bool:
    return all(
        pa == pb and all(np.array_equal(x, y) for x, y in zip(ba, bb, strict=True))
        for (ba, pa), (bb, pb) in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("depth", [0, 2])
def test_steps_and_positions_are_the_streams(depth):
    stream = BatchStream(reversal(96, 1), 80, SEED)
    expected = [(stream.take(PER_STEP), stream.position) for _ in range(10)]
    feed = prefetcher(depth)
    assert feed.position == {"epoch": 0, "index": 0}
    got = steps(feed, 10)
    feed.close()
    assert same(got, expected) and got[-1][1]["epoch"] >= 1  # across epochs


@pytest.mark.parametrize("depth", [0, 2])
def test_seek_and_close_continue_at_the_exact_position(depth):
    straight = steps(prefetcher(depth), 8)
    feed = prefetcher(depth)
    first = steps(feed, 3)
    feed.close()  # the thread had read ahead: the next step is still the 4th
    middle = steps(feed, 2)
    saved = dict(feed.position)
    steps(feed, 2)  # steps a resume does not see
    feed.seek(saved)
    assert feed.position == saved
    rest = steps(feed, 3)
    feed.close()
    assert same(first + middle + rest, straight)
    resumed = prefetcher(depth, **saved)  # a new process from the checkpoint's position
    assert same(steps(resumed, 3), straight[5:])
    resumed.close()
