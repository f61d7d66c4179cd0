"""Token-budget batches from length buckets (paper 5.1: "batched together by approximate length").

A row's size is ``max(src_len, tgt_len)``: a batch of ``n`` rows whose largest size is ``L``
pads both its source and its target to at most ``L`` columns, so ``n * L`` bounds the padded
size of either side and is what ``max_tokens`` limits. Rows are ordered by bucket (``bucket_width``
consecutive sizes, shuffled within) and that order is cut greedily: each batch takes rows until
one more would break the budget, so batches run across buckets and every batch but the last is
full, as fairseq's ``batch_by_size`` fills them: cutting each bucket on its own would leave a
partial batch, down to one sentence, at every size (docs/multi30k.md, "the batches"). Planning
is numpy plus one short Python loop per batch: well under a second for millions of rows.

A row larger than ``max_tokens`` is an error: it could never fit, and silently giving it a batch
of its own would break the memory bound the budget promises.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import torch


def plan_batches(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int = 0,
    bucket_width: int = 1,
    max_sentences: int | None = None,
    shuffle: bool = True,
    pad_multiple: int = 1,
) -> list[np.ndarray]:
    """Row indices per batch; every row exactly once, each batch within ``max_tokens`` padded
    tokens.

    With ``shuffle``, rows within a bucket and the order of batches are shuffled with a generator
    seeded by ``(seed, epoch)``: the same pair gives the same plan, another epoch another one.
    Without it, batches come in increasing length order and rows in index order (decoding).
    With ``pad_multiple`` m, a row's size is rounded up to a multiple of m, as ``collate`` pads.
    """
    if bucket_width < 1:
        raise ValueError(f"bucket_width {bucket_width} must be >= 1")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences {max_sentences} must be >= 1 or None")
    _, _, size = _row_sizes(src_lens, tgt_lens, max_tokens, pad_multiple)

    rng = np.random.default_rng([seed, epoch])
    n = size.size
    order = rng.permutation(n) if shuffle else np.arange(n)
    bucket = size // bucket_width
    order = order[np.argsort(bucket[order], kind="stable")]  # by bucket, shuffled within

    cuts = _fill(np.maximum.accumulate(size[order]), max_tokens, max_sentences)
    batches = np.split(order, cuts)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def plan_batches_fairseq(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int = 0,
    multiple: int = 8,
    pad_multiple: int = 1,
) -> list[np.ndarray]:
    """fairseq 0.9's training batches for translation (``ordered_indices``, ``batch_by_size``):
    one seeded permutation ordered by source length, ties by target length, cut greedily by
    ``max(src_len, tgt_len)`` padded tokens; when a row would break the budget the batch keeps a
    multiple of ``multiple`` rows and the rest start the next (``--required-batch-size-multiple``).
    The batches are the same every epoch; only their order is shuffled, by ``(seed, epoch)``.
    ``pad_multiple`` rounds a row's size up as ``collate`` pads (1 in fairseq)."""
    src, tgt, size = _row_sizes(src_lens, tgt_lens, max_tokens, pad_multiple)
    order = np.random.default_rng([seed]).permutation(size.size)
    order = order[np.argsort(tgt[order], kind="stable")]
    order = order[np.argsort(src[order], kind="stable")]
    # A Python loop as fairseq's own (data_utils_fast.pyx): each cut depends on the rows carried.
    batches, batch, sizes = [], [], []
    for row, n in zip(order.tolist(), size[order].tolist(), strict=True):
        sizes.append(n)
        if batch and (len(batch) + 1) * max(sizes) > max_tokens:
            keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
            batches.append(batch[:keep])
            batch, sizes = batch[keep:], sizes[keep:]
        batch.append(row)
    batches.append(batch)
    shuffled = np.random.default_rng([seed, epoch]).permutation(len(batches))
    return [np.asarray(batches[i], dtype=np.int64) for i in shuffled]


def _fill(width: np.ndarray, max_tokens: int, max_sentences: int | None) -> list[int]:
    """Where to cut rows ``0 .. n-1`` into batches, greedily, given ``width[j]``: the running
    maximum of the sizes in planning order. ``width`` never decreases, so rows ``i .. j-1`` fit
    when ``(j - i) * width[j - 1] <= max_tokens`` (exact for ``bucket_width`` 1; otherwise
    an upper bound within one bucket's width of the batch's true largest size)."""
    # A Python loop because each cut depends on the one before; it runs once per batch, not per
    # row, and finds the cut by bisection: (j - i) * width[j - 1] grows with j.
    w = width.tolist()
    n, cap = len(w), max_sentences or len(w)
    cuts, i = [], 0
    while i < n:
        ends = range(i + 1, min(n, i + cap, i + max_tokens // w[i]) + 1)  # row i always fits
        k = bisect.bisect_right(ends, max_tokens, key=lambda j, i=i: (j - i) * w[j - 1])
        i = ends[k - 1]
        cuts.append(i)
    return cuts[:-1]


def padding_efficiency(
    batches: Sequence[np.ndarray],
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
) -> float:
    """Real tokens / padded tokens, source and target together, over all ``batches``.

    A batch of ``n`` rows costs ``n * (max src_len + max tgt_len)`` padded tokens.
    """
    src = _lengths(src_lens, "src_lens")
    tgt = _lengths(tgt_lens, "tgt_lens")
    batches = [np.asarray(b, dtype=np.int64) for b in batches if len(b)]
    if not batches:
        raise ValueError("no batches to measure")
    rows = np.concatenate(batches)
    starts = np.r_[0, np.cumsum([b.size for b in batches])[:-1]]
    sizes = np.diff(np.r_[starts, rows.size])
    padded = sizes * (
        np.maximum.reduceat(src[rows], starts) + np.maximum.reduceat(tgt[rows], starts)
    )
    real = src[rows].sum() + tgt[rows].sum()
    return float(real / padded.sum())


def collate(
    rows_src: Sequence[Sequence[int] | np.ndarray],
    rows_tgt: Sequence[Sequence[int] | np.ndarray],
    pad_id: int,
    bos_id: int,
    pad_multiple: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a batch: ``src (B, S)``, ``tgt_in (B, T) = [BOS] + tgt[:-1]``, ``tgt_out (B, T) = tgt``,
    with ``S`` and ``T`` rounded up to a multiple of ``pad_multiple``.

    Target rows end with EOS (docs/contracts.md), so they are never empty.
    """
    if len(rows_src) != len(rows_tgt):
        raise ValueError(f"{len(rows_src)} source rows but {len(rows_tgt)} target rows")
    if len(rows_src) == 0:
        raise ValueError("cannot collate an empty batch")
    src = _pad([np.asarray(r, dtype=np.int64) for r in rows_src], pad_id, pad_multiple)
    tgt_rows = [np.asarray(r, dtype=np.int64) for r in rows_tgt]
    empty = [i for i, r in enumerate(tgt_rows) if r.size == 0]
    if empty:
        raise ValueError(f"target row {empty[0]} is empty; targets must end with EOS")
    tgt_out = _pad(tgt_rows, pad_id, pad_multiple)
    tgt_in = _pad([np.r_[bos_id, r[:-1]] for r in tgt_rows], pad_id, pad_multiple)
    return torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)


def _pad(rows: list[np.ndarray], pad_id: int, multiple: int = 1) -> np.ndarray:
    lens = np.array([r.size for r in rows])
    width = -(-max(int(lens.max()), 1) // multiple) * multiple
    out = np.full((len(rows), width), pad_id, dtype=np.int64)  # (B, L)
    # A row-major boolean mask visits cells in the order the rows are concatenated.
    out[np.arange(out.shape[1]) < lens[:, None]] = np.concatenate(rows)
    return out


def _row_sizes(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    pad_multiple: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lengths as arrays and each row's size, ``max(src_len, tgt_len)`` rounded up to
    ``pad_multiple``; a clear error for mismatched or empty lengths, a bad budget, or a row that
    could never fit."""
    src = _lengths(src_lens, "src_lens")
    tgt = _lengths(tgt_lens, "tgt_lens")
    if src.shape != tgt.shape:
        raise ValueError(f"src_lens has {src.size} rows but tgt_lens has {tgt.size}")
    if src.size == 0:
        raise ValueError("cannot plan batches for an empty dataset (0 rows)")
    if max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens} must be >= 1")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple {pad_multiple} must be >= 1")
    size = np.maximum(np.maximum(src, tgt), 1)  # an empty row still takes a column (EOS)
    size = -(-size // pad_multiple) * pad_multiple
    too_long = np.flatnonzero(size > max_tokens)
    if too_long.size:
        first = int(too_long[0])
        raise ValueError(
            f"{too_long.size} row(s) exceed max_tokens={max_tokens}, e.g. row {first} with "
            f"{int(size[first])} tokens; raise max_tokens or filter long rows first"
        )
    return src, tgt, size


def _lengths(values: Sequence[int] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} holds a negative length at row {int(np.argmin(arr))}")
    return arr
