"""Translating a whole test set on Ray: a Ray Data actor pool of ``Translator``s.

The source is a split the shard stage already encoded (``part-*.parquet``: ``src_ids``,
``src_len``). The driver reads only the lengths and cuts the rows into token-budget batches
(``decode.max_tokens_per_batch`` source tokens, sorted by length: the plan needs every length
at once); each planned batch is one Ray Data row of row indices. A pool of ``decode.num_actors``
actors (one GPU each when the cluster has GPUs) loads the model, the tokenizer and the split's
ids once and decodes whole batches. Every result carries its row index, so output i is always
the translation of input i.

With ``decode.engine: ctranslate2`` the driver exports the checkpoint once before the pool
starts (or finds the export already there); each actor then loads that export, once.

A ``probe`` (the translate stage's attention map) runs in the actors on the rows it names,
with the model they already hold, so nothing loads the model a second time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from corpora import actor_pools
from filesystem.storage import StoredFolder, fetch_all
from serving.translator import DecodeConfig, Translator, plan_decode_batches, restore_order

__all__ = [
    "BatchTranslator",
    "Decoded",
    "Probe",
    "Progress",
    "pool_size",
    "read_lengths",
    "translate_distributed",
]

log = logging.getLogger(__name__)

Probe = Callable[[Translator, Sequence[int], str], object]
"""Called in an actor with its ``Translator``, a row's source ids and its translation; what it
returns (picklable; None for nothing) comes back to the driver by row."""


def read_lengths(files: Sequence[str | Path]) -> np.ndarray:
    """The ``src_len`` column of a split's Parquet parts, in row order (pieces + EOS per row)."""
    import pyarrow.parquet as pq

    parts = [pq.read_table(f, columns=["src_len"]).column("src_len").to_numpy() for f in files]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _read_ids(files: Sequence[str | Path]) -> Any:
    """The ``src_ids`` column of a split's Parquet parts as one Arrow ``list<int32>`` array."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return (
        pa.concat_tables(pq.read_table(f, columns=["src_ids"]) for f in files)
        .column("src_ids")
        .combine_chunks()
    )


class Progress:
    """Sentences translated so far: a tqdm bar for a person at a terminal, else (logs, CI) a
    plain line at every tenth of the total, with the rate, elapsed time and ETA."""

    def __init__(
        self,
        total: int,
        out: IO[str] | None = None,
        bar: bool | None = None,
        label: str = "translate",
    ):
        from tqdm import tqdm

        self.total, self.done, self.out, self.label = total, 0, out or sys.stderr, label
        if bar is None:
            bar = self.out.isatty() and os.environ.get("CI", "").lower() != "true"
        self.bar = tqdm(total=total, unit="sent", desc=label, file=self.out) if bar else None
        self.started, self.next_line = time.time(), 0.1

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if self.done / self.total + 1e-9 < self.next_line and self.done < self.total:
            return
        from tqdm import tqdm

        elapsed = time.time() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        self.out.write(
            f"{self.label} {self.done}/{self.total} sentences "
            f"({100 * self.done / self.total:.0f}%)"
            f" | {rate:,.1f} sent/s | {tqdm.format_interval(elapsed)} elapsed, ETA "
            f"{tqdm.format_interval(eta)}\n"
        )
        self.out.flush()
        while self.next_line <= self.done / self.total + 1e-9:
            self.next_line += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class BatchTranslator:
    """Ray Data actor: loads the engine (``decode.engine``), the tokenizer and the source ids
    (``source``: the split's Parquet parts) once, decodes planned batches.

    Each input row is one planned batch (``idx``: row indices); the output has one row per
    sentence: ``idx``, ``hyp`` (text), ``hyp_tokens``, ``seconds`` (its share of its batch's
    decoding time) and ``probe`` (the pickled result of ``probe`` for ``probe_rows``, else b"").
    """

    def __init__(
        self,
        model_path: str,
        tokenizer_dir: str,
        decode: dict[str, Any],
        source: Sequence[str],
        export_dir: str | None = None,
        probe: Probe | None = None,
        probe_rows: Collection[int] = (),
        fetch: Sequence[StoredFolder] = (),
    ):
        fetch_all(fetch)  # this node's copies of the inputs, at the paths the driver gave
        self.translator = Translator.load(
            model_path, tokenizer_dir, DecodeConfig.from_dict(decode), export_dir=export_dir
        )
        self.src_ids = _read_ids(source)
        self.probe, self.probe_rows = probe, frozenset(probe_rows)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idx: list[int] = []
        hyps: list[str] = []
        n_tokens: list[int] = []
        seconds: list[float] = []
        for planned in batch["idx"]:
            rows = [int(i) for i in planned]
            started = time.perf_counter()
            out = self.translator.translate_batch([self.src_ids[i].as_py() for i in rows])
            idx.extend(rows)
            hyps.extend(self.translator.detokenize(out))
            n_tokens.extend(len(seq) for seq in out)
            seconds.extend([(time.perf_counter() - started) / len(rows)] * len(rows))
        return {
            "idx": np.asarray(idx, dtype=np.int64),
            "hyp": np.asarray(hyps, dtype=object),
            "hyp_tokens": np.asarray(n_tokens, dtype=np.int64),
            "seconds": np.asarray(seconds, dtype=np.float64),
            "probe": np.asarray(
                [self._probe(i, h) for i, h in zip(idx, hyps, strict=True)], dtype=object
            ),
        }

    def _probe(self, row: int, hyp: str) -> bytes:
        if self.probe is None or row not in self.probe_rows:
            return b""
        found = self.probe(self.translator, self.src_ids[row].as_py(), hyp)
        return b"" if found is None else pickle.dumps(found)


@dataclasses.dataclass(frozen=True)
class Decoded:
    """What ``translate_distributed`` returns, in input order."""

    hyps: list[str]
    """The translations (detokenized text)."""
    hyp_tokens: list[int]
    """Output pieces per translation."""
    info: dict[str, Any]
    """Actors, GPUs per actor, batches and the actors' own decoding seconds."""
    probes: dict[int, object]
    """The probe's results by row, for the rows where it returned something."""


def translate_distributed(
    model_path: Path,
    tokenizer_dir: Path,
    source: Sequence[Path],
    decode: DecodeConfig,
    export_dir: Path | None = None,
    *,
    lengths: np.ndarray | None = None,
    probe: Probe | None = None,
    probe_rows: Collection[int] = (),
    fetch: Sequence[StoredFolder] = (),
) -> Decoded:
    """Decode the split whose Parquet parts are ``source`` with a Ray Data actor pool (Ray must
    be running). ``lengths``: its ``src_len`` column, if the caller has read it already.
    ``export_dir``: where engine ctranslate2 keeps its export (default: next to the checkpoint).
    ``fetch``: the object-store folders the paths are this node's copies of; an actor on
    another node copies them to the same paths first."""
    import ray

    if decode.engine == "ctranslate2":
        # Once here rather than racing in every actor: the actors find it and only load it.
        from serving import ct2_export

        export_dir = export_dir or ct2_export.default_export_dir(model_path)
        ct2_export.export_ctranslate2(model_path, tokenizer_dir, export_dir, decode=decode)
    if lengths is None:
        lengths = read_lengths(source)
    batches = plan_decode_batches(lengths, decode.max_tokens_per_batch)
    actors, resources = pool_size(decode.num_actors)
    ds = ray.data.from_items(
        [{"idx": rows.tolist()} for rows in batches], override_num_blocks=len(batches)
    ).map_batches(
        BatchTranslator,
        fn_constructor_kwargs={
            "model_path": str(model_path),
            "tokenizer_dir": str(tokenizer_dir),
            "decode": dataclasses.asdict(decode),
            "source": [str(f) for f in source],
            "export_dir": None if export_dir is None else str(export_dir),
            "probe": probe,
            "probe_rows": sorted(probe_rows),
            "fetch": tuple(fetch),
        },
        batch_size=1,  # one planned batch per call: the plan already holds the token budget
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_format="numpy",
        **resources,
        max_restarts=actor_pools.max_restarts(),
    )
    idx: list[int] = []
    hyps: list[str] = []
    counts: list[int] = []
    probes: dict[int, object] = {}
    busy = 0.0
    progress = Progress(len(lengths))
    for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
        progress.update(len(out["idx"]))
        idx.extend(int(i) for i in out["idx"])
        hyps.extend(str(h) for h in out["hyp"])
        counts.extend(int(c) for c in out["hyp_tokens"])
        probes.update(
            (int(i), pickle.loads(p)) for i, p in zip(out["idx"], out["probe"], strict=True) if p
        )
        busy += float(out["seconds"].sum())
    progress.close()
    # restore_order checks every row came back exactly once.
    info = {
        "actors": actors,
        "gpus_per_actor": resources.get("num_gpus", 0),
        "batches": len(batches),
        "actor_decode_seconds": round(busy, 3),
    }
    return Decoded(
        restore_order([idx], [hyps], len(lengths)),
        restore_order([idx], [counts], len(lengths)),
        info,
        probes,
    )


def pool_size(wanted: int) -> tuple[int, dict[str, Any]]:
    """Actors of a translating pool (Ray must be running) and each one's resources: one GPU (or
    one CPU) per actor, since more actors than the cluster holds would wait forever."""
    import ray

    cluster = ray.cluster_resources()
    gpus = int(cluster.get("GPU", 0))
    if gpus:
        actors, resources = min(wanted, gpus), {"num_gpus": 1}
    else:
        actors, resources = max(1, min(wanted, int(cluster.get("CPU", 1)))), {}
    if actors != wanted:
        log.warning("translate: %d actors instead of %d (cluster resources)", actors, wanted)
    return actors, resources
