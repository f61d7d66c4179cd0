"""Translating a whole corpus on Ray: one Ray Data actor pool of ``CorpusTranslator``s, which
the translate stage (``translate_split``) and the distill stage (``translate_shards``) share.

The corpus is cut into pieces, one Ray Data row each. A pool of ``decode.num_actors`` actors
(one GPU each when the cluster has GPUs, ``pool_size``) loads the engine and the tokenizer once
and translates a piece per call in token-budget batches of its sentences sorted by length
(``Translator.nbest_ids``), returning per sentence its row, translation, pieces, the model's
mean log-probability per token of it (``mean_log_prob``), its share of the piece's time and a
``probe``'s result. With ``decode.engine: ctranslate2`` the driver exports the checkpoint once
before the pool starts (or finds the export already there); each actor only loads it.

The two drivers cut and collect differently:

- ``translate_split``: the source is a split the shard stage encoded (``part-*.parquet``:
  ``src_ids``, ``src_len``); the actors read its ids once. The driver reads only the lengths
  and plans the token-budget batches over the whole split (the plan needs every length at
  once); each planned batch is a piece. The results come back in input order (``Decoded``),
  with the probe's (the translate stage's attention maps, from the model the actors hold).
- ``translate_shards``: the sources are texts, cut into shards of consecutive sentences, a
  shard a piece. The driver writes a shard once all of its sentences are back, as
  ``part-NNNNN.parquet`` in a folder of the caller's that outlives the process (a temporary
  file renamed: ``serving.translated_shards``), so a run that was killed resumes with the
  shards it had not written. When a translator dies (its process killed, a node lost) the
  driver starts the pool again on the shards not yet written, ``max_failures`` times at most:
  the dead one's batches are redone, a written shard never is. On more than one node Ray Data
  also restarts a lost actor itself (``corpora.actor_pools``).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpora import actor_pools
from filesystem.storage import StoredPath, on_this_node
from serving.translate_progress import Progress
from serving.translated_shards import PendingShard, collect, shard_name, write_shard
from serving.translator import DecodeConfig, Translator, plan_decode_batches, restore_order
from transformer_core.search_settings import BeamSettings, Hypothesis, length_penalty

__all__ = [
    "CorpusTranslator",
    "Decoded",
    "Probe",
    "mean_log_prob",
    "pool_size",
    "read_lengths",
    "translate_shards",
    "translate_split",
    "worker_died",
]

log = logging.getLogger(__name__)

Probe = Callable[[Translator, Sequence[int], str], object]
"""Called in an actor with its ``Translator``, a row's source ids and its translation; what it
returns (picklable; None for nothing) comes back to the driver by row."""


def mean_log_prob(hyp: Hypothesis, decode: BeamSettings) -> float:
    """A hypothesis's log-probability per decoded position (its pieces and EOS), recovered from
    the search's length-penalised score (0 for an empty source's undecoded output)."""
    positions = len(hyp.tokens) + 1
    return hyp.score * length_penalty(positions, decode.alpha, decode.length_norm) / positions


def read_lengths(files: Sequence[str | Path]) -> np.ndarray:
    """The ``src_len`` column of a split's Parquet parts, in row order (pieces + EOS per row)."""
    import pyarrow.parquet as pq

    parts = [pq.read_table(f, columns=["src_len"]).column("src_len").to_numpy() for f in files]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _read_ids(files: Sequence[str | Path]) -> Any:
    """The ``src_ids`` column of a split's Parquet parts as one Arrow ``list<int32>`` array."""
    import pyarrow.parquet as pq

    return (
        pa.concat_tables(pq.read_table(f, columns=["src_ids"]) for f in files)
        .column("src_ids")
        .combine_chunks()
    )


class CorpusTranslator:
    """Ray Data actor: loads the engine (``decode.engine``), the tokenizer and, when ``source``
    names a split's Parquet parts, its ids, once; then translates pieces.

    Each input row is a piece: ``piece`` (its number), ``rows`` (corpus row numbers) and, when
    the actor holds no split, ``src`` (their texts). One output row per sentence: ``piece``,
    ``row``, ``tgt`` (text), ``tgt_len`` (pieces), ``score`` (``mean_log_prob``), ``seconds``
    (its share of its piece's time) and ``probe`` (the pickled result of ``probe`` for
    ``probe_rows``, else b"").
    """

    def __init__(
        self,
        model_path: str | StoredPath,
        tokenizer_dir: str | StoredPath,
        decode: dict[str, Any],
        source: Sequence[str | StoredPath] = (),
        export_dir: str | None = None,
        probe: Probe | None = None,
        probe_rows: Collection[int] = (),
    ):
        self.decode = DecodeConfig.from_dict(decode)
        self.translator = Translator.load(  # this node's copies, made now if it has none
            on_this_node(model_path),
            on_this_node(tokenizer_dir),
            self.decode,
            export_dir=export_dir,
        )
        self.src_ids = _read_ids([str(on_this_node(s)) for s in source]) if source else None
        self.probe, self.probe_rows = probe, frozenset(probe_rows)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, list[Any]] = {k: [] for k in ("piece", "row", "tgt", "tgt_len", "score")}
        seconds: list[float] = []
        probes: list[bytes] = []
        for j, (piece, planned) in enumerate(zip(batch["piece"], batch["rows"], strict=True)):
            started = time.perf_counter()
            rows = [int(i) for i in planned]
            ids = self._ids(batch, j, rows)
            best = [hyps[0] for hyps in self.translator.nbest_ids(ids, 1)]
            tgt = self.translator.detokenize([h.tokens for h in best])
            out["piece"] += [int(piece)] * len(rows)
            out["row"] += rows
            out["tgt"] += tgt
            out["tgt_len"] += [len(h.tokens) for h in best]
            out["score"] += [mean_log_prob(h, self.decode) for h in best]
            seconds += [(time.perf_counter() - started) / max(len(rows), 1)] * len(rows)
            probes += [self._probe(*found) for found in zip(rows, ids, tgt, strict=True)]
        return {
            "piece": np.asarray(out["piece"], dtype=np.int64),
            "row": np.asarray(out["row"], dtype=np.int64),
            "tgt": np.asarray(out["tgt"], dtype=object),
            "tgt_len": np.asarray(out["tgt_len"], dtype=np.int32),
            "score": np.asarray(out["score"], dtype=np.float64),
            "seconds": np.asarray(seconds, dtype=np.float64),
            "probe": np.asarray(probes, dtype=object),
        }

    def _ids(self, batch: dict[str, np.ndarray], j: int, rows: list[int]) -> list[list[int]]:
        """Piece ``j``'s source ids: the split's ``rows``, else its texts (``src``) encoded."""
        if self.src_ids is None:
            return self.translator.encode([str(t) for t in batch["src"][j]])
        return [self.src_ids[i].as_py() for i in rows]

    def _probe(self, row: int, src_ids: Sequence[int], tgt: str) -> bytes:
        if self.probe is None or row not in self.probe_rows:
            return b""
        found = self.probe(self.translator, src_ids, tgt)
        return b"" if found is None else pickle.dumps(found)


def _actor_args(
    model_path: Path | StoredPath,
    tokenizer_dir: Path | StoredPath,
    decode: DecodeConfig,
    export_dir: Path | None,
    *,
    source: Sequence[Path | StoredPath] = (),
    probe: Probe | None = None,
    probe_rows: Collection[int] = (),
) -> dict[str, Any]:
    """The actors' constructor arguments, after the ctranslate2 export the engine needs: made
    once here rather than racing in every actor, which find it and only load it."""
    if decode.engine == "ctranslate2":
        from serving import ct2_export

        model, tokenizer = on_this_node(model_path), on_this_node(tokenizer_dir)
        export_dir = export_dir or ct2_export.default_export_dir(model)
        ct2_export.export_ctranslate2(model, tokenizer, export_dir, decode=decode)
    return {  # a local path as text; a stored one as it is, for each node to copy
        "model_path": _for_actor(model_path),
        "tokenizer_dir": _for_actor(tokenizer_dir),
        "decode": dataclasses.asdict(decode),
        "export_dir": None if export_dir is None else str(export_dir),
        "source": [_for_actor(f) for f in source],
        "probe": probe,
        "probe_rows": sorted(probe_rows),
    }


def _for_actor(path: Path | StoredPath) -> str | StoredPath:
    return path if isinstance(path, StoredPath) else str(path)


def _translated(
    pieces: list[dict[str, Any]], args: dict[str, Any], actors: int, resources: dict[str, Any]
) -> Iterator[dict[str, np.ndarray]]:
    """The pool's output batches for ``pieces`` (one piece per actor call), as they come."""
    import ray

    ds = ray.data.from_items(pieces, override_num_blocks=len(pieces)).map_batches(
        CorpusTranslator,
        fn_constructor_kwargs=args,
        batch_size=1,  # one piece per call: the piece is what the actor batches by length
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_format="numpy",
        **resources,
        max_restarts=actor_pools.max_restarts(),
    )
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        assert isinstance(batch, dict)  # Ray types a batch as any batch format's
        yield batch


@dataclasses.dataclass(frozen=True)
class Decoded:
    """What ``translate_split`` returns, in input order."""

    hyps: list[str]
    """The translations (detokenized text)."""
    hyp_tokens: list[int]
    """Output pieces per translation."""
    info: dict[str, Any]
    """Actors, GPUs per actor, batches and the actors' own decoding seconds."""
    probes: dict[int, object]
    """The probe's results by row, for the rows where it returned something."""


def translate_split(
    model_path: Path | StoredPath,
    tokenizer_dir: Path | StoredPath,
    source: Sequence[Path | StoredPath],
    decode: DecodeConfig,
    export_dir: Path | None = None,
    *,
    lengths: np.ndarray | None = None,
    probe: Probe | None = None,
    probe_rows: Collection[int] = (),
) -> Decoded:
    """Decode the split whose Parquet parts are ``source`` (Ray must be running). ``lengths``:
    its ``src_len`` column, if the caller has read it already. ``export_dir``: where engine
    ctranslate2 keeps its export (default: next to the checkpoint). The model, the tokenizer and
    the source are local paths (this node's) or ``StoredPath``s (each actor reads its node's copy:
    a pool on a cluster)."""
    args = _actor_args(
        model_path,
        tokenizer_dir,
        decode,
        export_dir,
        source=source,
        probe=probe,
        probe_rows=probe_rows,
    )
    if lengths is None:
        lengths = read_lengths([on_this_node(s) for s in source])
    batches = plan_decode_batches(lengths, decode.max_tokens_per_batch)
    pieces = [{"piece": b, "rows": rows.tolist()} for b, rows in enumerate(batches)]
    actors, resources = pool_size(decode.num_actors)
    idx: list[int] = []
    hyps: list[str] = []
    counts: list[int] = []
    probes: dict[int, object] = {}
    busy = 0.0
    progress = Progress(len(lengths))
    try:
        for out in _translated(pieces, args, actors, resources):
            progress.update(len(out["row"]))
            idx.extend(int(i) for i in out["row"])
            hyps.extend(str(h) for h in out["tgt"])
            counts.extend(int(c) for c in out["tgt_len"])
            probes.update(
                (int(i), pickle.loads(p))
                for i, p in zip(out["row"], out["probe"], strict=True)
                if p
            )
            busy += float(out["seconds"].sum())
    finally:
        progress.close()
    info = {
        "actors": actors,
        "gpus_per_actor": resources.get("num_gpus", 0),
        "batches": len(batches),
        "actor_decode_seconds": round(busy, 3),
    }
    # restore_order checks every row came back exactly once.
    return Decoded(
        restore_order([idx], [hyps], len(lengths)),
        restore_order([idx], [counts], len(lengths)),
        info,
        probes,
    )


def translate_shards(
    model_path: Path | StoredPath,
    tokenizer_dir: Path | StoredPath,
    sources: Sequence[str],
    decode: DecodeConfig,
    out: Path,
    rows_per_shard: int,
    *,
    export_dir: Path | None = None,
    max_failures: int = 1,
    label: str = "distill",
) -> dict[str, Any]:
    """Translate ``sources`` into the shards ``out/part-NNNNN.parquet`` (``SHARD_SCHEMA`` of
    ``serving.translated_shards``) of ``rows_per_shard`` sentences, skipping the shards ``out``
    holds already (Ray must be running); counts and timings. ``export_dir``: where engine
    ctranslate2 keeps its export. The model and the tokenizer as ``translate_split``'s."""
    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(sources), rows_per_shard)
    shards = [list(sources[i : i + rows_per_shard]) for i in starts]
    written = [k for k in range(len(shards)) if (out / shard_name(k)).is_file()]
    if written:
        log.info(
            "%s: %d of %d shards already translated in %s", label, len(written), len(shards), out
        )
    args = _actor_args(model_path, tokenizer_dir, decode, export_dir)
    started, busy, restarts = time.perf_counter(), 0.0, 0
    while True:
        pending = [k for k in range(len(shards)) if not (out / shard_name(k)).is_file()]
        if not pending:
            break
        try:
            wanted = decode.num_actors
            busy += _write_shards(shards, rows_per_shard, pending, args, out, wanted, label)
        except Exception as exc:
            if restarts >= max_failures or not worker_died(exc):
                raise
            restarts += 1
            log.warning(
                "%s: a translator died (%s); starting again on the shards not yet written "
                "(%d of %d)",
                label,
                type(exc).__name__,
                sum(not (out / shard_name(k)).is_file() for k in pending),
                len(shards),
            )
    seconds = time.perf_counter() - started
    done = sum(len(shards[k]) for k in range(len(shards)) if k not in set(written))
    return {
        "sentences": len(sources),
        "shards": len(shards),
        "shards_reused": len(written),
        "shards_translated": len(shards) - len(written),
        "restarts": restarts,
        "translate_seconds": round(seconds, 3),
        "sentences_per_s": round(done / seconds, 2) if done and seconds > 0 else None,
        "actor_seconds": round(busy, 3),
    }


def _write_shards(
    shards: list[list[str]],
    size: int,
    pending: list[int],
    args: dict[str, Any],
    out: Path,
    wanted: int,
    label: str,
) -> float:
    """One pool over the ``pending`` shards (of ``size`` rows), each written as soon as it is
    whole; the actors' own seconds."""
    collecting = {k: PendingShard.of(k * size, shards[k]) for k in pending}
    pieces = [
        {"piece": k, "rows": list(range(s.start, s.start + len(s.src))), "src": s.src}
        for k, s in collecting.items()
    ]
    busy = 0.0
    progress = Progress(sum(len(shards[k]) for k in pending), label=label)
    try:
        for batch in _translated(pieces, args, *pool_size(wanted)):
            progress.update(len(batch["row"]))
            busy += float(batch["seconds"].sum())
            for k in collect(collecting, batch):
                write_shard(out / shard_name(k), collecting.pop(k))
    finally:
        progress.close()
    return busy


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


def worker_died(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a Ray actor or worker that died, not an error of
    the translation itself."""
    from ray.exceptions import RayActorError, WorkerCrashedError

    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, (RayActorError, WorkerCrashedError)):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False
