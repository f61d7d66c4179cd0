"""How much of a test set a model saw in training: the share of its sources and of its targets
that occur, exactly, on the same side of the training split (the clean stage's Parquet parts,
``src`` and ``tgt``, normalised as the set's own text must be before the comparison)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["training_overlap"]


def training_overlap(
    train_files: Sequence[Path], sources: Sequence[str], targets: Sequence[str]
) -> dict[str, float]:
    """``sources_seen`` and ``targets_seen``: the share of ``sources`` found in the training
    split's ``src`` column and of ``targets`` in its ``tgt`` column (read a part at a time)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = {
        "src": pa.array(sorted(set(sources)), pa.string()),
        "tgt": pa.array(sorted(set(targets)), pa.string()),
    }
    found: dict[str, set[str]] = {"src": set(), "tgt": set()}
    for path in train_files:
        table = pq.read_table(path, columns=["src", "tgt"])
        for side, values in wanted.items():
            hit = pc.is_in(values, value_set=table.column(side).combine_chunks())
            found[side].update(values.filter(hit).to_pylist())
    return {
        "sources_seen": _share(sources, found["src"]),
        "targets_seen": _share(targets, found["tgt"]),
    }


def _share(texts: Sequence[str], seen: set[str]) -> float:
    return round(sum(t in seen for t in texts) / len(texts), 4) if texts else 0.0
