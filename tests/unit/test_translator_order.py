"""The decoding batch plan and the order restoring that undoes it (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from serving.translator import plan_decode_batches, restore_order


def _shuffled_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.permutation(np.concatenate([rng.integers(1, 60, size=n - 2), [1, 59]]))


@pytest.mark.parametrize("max_tokens", [1, 7, 64, 500, 10_000])
def test_plan_covers_every_row_once_within_budget(max_tokens: int) -> None:
    lengths = _shuffled_lengths(200, seed=max_tokens)
    batches = plan_decode_batches(lengths, max_tokens)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(200))
    for batch in batches:
        padded = len(batch) * lengths[batch].max()
        assert padded <= max_tokens or len(batch) == 1


def test_plan_sorts_by_length_longest_first() -> None:
    lengths = _shuffled_lengths(100, seed=1)
    batches = plan_decode_batches(lengths, 64)
    flat = lengths[np.concatenate(batches)]
    assert (np.diff(flat) <= 0).all()
    # Sorting gives batches of similar lengths, so they pad little.
    padded = sum(len(b) * lengths[b].max() for b in batches)
    assert padded < 1.3 * lengths.sum()


def test_plan_is_deterministic_and_keeps_index_order_for_ties() -> None:
    lengths = [3, 5, 3, 5, 3]
    assert [b.tolist() for b in plan_decode_batches(lengths, 10)] == [[1, 3], [0, 2, 4]]
    again = plan_decode_batches(lengths, 10)
    assert [b.tolist() for b in again] == [[1, 3], [0, 2, 4]]


def test_restore_order_undoes_the_plan() -> None:
    lengths = _shuffled_lengths(150, seed=7)
    texts = [f"sentence {i} " + "x" * int(n) for i, n in enumerate(lengths)]
    batches = plan_decode_batches(lengths, 100)
    # A fake "translation" per batch, in the batch's (sorted) order.
    results = [[texts[i].upper() for i in rows] for rows in batches]
    assert restore_order(batches, results, len(texts)) == [t.upper() for t in texts]


def test_restore_order_accepts_results_in_any_batch_order() -> None:
    batches = [np.array([2, 0]), np.array([1])]
    assert restore_order(batches[::-1], [["b"], ["c", "a"]], 3) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("batches", "results", "message"),
    [
        ([[0, 1]], [["a"]], "came back with 1 results"),
        ([[0, 0]], [["a", "b"]], "appears twice"),
        ([[0]], [["a"]], r"rows \[1\] got no result"),
        ([[0, 5]], [["a", "b"]], "out of range"),
        ([[0], [1]], [["a"]], "2 batches but 1 result lists"),
    ],
)
def test_restore_order_rejects_lost_or_duplicated_rows(batches, results, message) -> None:
    with pytest.raises(ValueError, match=message):
        restore_order(batches, results, 2)


def test_empty_input_and_bad_budget() -> None:
    assert plan_decode_batches([], 100) == []
    assert restore_order([], [], 0) == []
    with pytest.raises(ValueError, match="max_tokens"):
        plan_decode_batches([1, 2], 0)
