"""Token-budget batches from length buckets (paper 5.1: "batched together by approximate length").

A row's size is ``max(src_len, tgt_len)``: a batch of ``n`` rows whose largest size is ``L``
pads both its source and its target to at most ``L`` columns, so ``n * L`` bounds the padded
size of either side and is what ``max_tokens`` limits. Rows are grouped into buckets of
``bucket_width`` consecutive sizes; each bucket is cut into batches of
``max_tokens // (largest size in the bucket)`` rows, so batches never span buckets. Planning is
vectorised numpy: a few seconds for millions of rows.

A row larger than ``max_tokens`` is an error: it could never fit, and silently giving it a batch
of its own would break the memory bound the budget promises.
"""

from __future__ import annotations

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
    """Row indices per batch; every row exactly once, each batch within ``max_tokens`` padded tokens.

    With ``shuffle``, rows within a bucket and the order of batches are shuffled with a generator
    seeded by ``(seed, epoch)``: the same pair gives the same plan, another epoch another one.
    Without it, batches come in increasing length order and rows in index order (decoding).
    With ``pad_multiple`` m, a row's size is rounded up to a multiple of m, as ``collate`` pads.
    """
    src = _lengths(src_lens, "src_lens")
    tgt = _lengths(tgt_lens, "tgt_lens")
    if src.shape != tgt.shape:
        raise ValueError(f"src_lens has {src.size} rows but tgt_lens has {tgt.size}")
    if src.size == 0:
        raise ValueError("cannot plan batches for an empty dataset (0 rows)")
    if max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens} must be >= 1")
    if bucket_width < 1:
        raise ValueError(f"bucket_width {bucket_width} must be >= 1")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple {pad_multiple} must be >= 1")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences {max_sentences} must be >= 1 or None")

    size = np.maximum(np.maximum(src, tgt), 1)  # an empty row still takes a column (EOS)
    size = -(-size // pad_multiple) * pad_multiple
    too_long = np.flatnonzero(size > max_tokens)
    if too_long.size:
        first = int(too_long[0])
        raise ValueError(
            f"{too_long.size} row(s) exceed max_tokens={max_tokens}, e.g. row {first} with "
            f"{int(size[first])} tokens; raise max_tokens or filter long rows first"
        )

    rng = np.random.default_rng([seed, epoch])
    n = size.size
    order = rng.permutation(n) if shuffle else np.arange(n)
    bucket = size // bucket_width
    order = order[np.argsort(bucket[order], kind="stable")]  # by bucket, shuffled within

    sorted_bucket = bucket[order]
    starts = np.flatnonzero(np.r_[True, sorted_bucket[1:] != sorted_bucket[:-1]])
    counts = np.diff(np.r_[starts, n])
    bucket_max = np.maximum.reduceat(size[order], starts)
    rows_per_batch = max_tokens // bucket_max
    if max_sentences is not None:
        rows_per_batch = np.minimum(rows_per_batch, max_sentences)

    position = np.arange(n) - np.repeat(starts, counts)  # index within the bucket
    batches_per_bucket = -(-counts // rows_per_batch)
    first_batch = np.r_[0, np.cumsum(batches_per_bucket)[:-1]]
    batch_id = np.repeat(first_batch, counts) + position // np.repeat(rows_per_batch, counts)
    batches = np.split(order, np.flatnonzero(np.diff(batch_id)) + 1)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


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
    rows_src: Sequence[Sequence[int]],
    rows_tgt: Sequence[Sequence[int]],
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
