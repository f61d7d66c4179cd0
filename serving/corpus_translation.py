"""Translating a whole corpus on Ray in shards that outlive the process (the distill stage's
teacher translations): ``translate_shards``.

The corpus is cut into shards of consecutive sentences. A Ray Data actor pool of
``ShardTranslator``s (each loads the model and tokenizer once) takes one shard per call,
decodes it in token-budget batches of sentences sorted by length (``Translator.nbest_ids``) and
returns each translation with the model's own score of it, its mean log-probability per token
(``mean_log_prob``). The driver writes a shard once all of its sentences are back, as
``part-NNNNN.parquet`` in a folder of the caller's that outlives the process (a temporary file
renamed), so a run that was killed resumes with the shards it had not written. When a
translator dies (its process killed, a node lost) the driver starts the pool again on the
shards not yet written, ``max_failures`` times at most: the dead one's batches are redone, a
written shard never is. On more than one node Ray Data also restarts a lost actor itself
(``corpora.actor_pools``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpora import actor_pools
from filesystem.storage import StoredFolder, fetch_all
from serving.batch import Progress, pool_size
from serving.translator import DecodeConfig, Translator
from transformer_core.search_settings import BeamSettings, Hypothesis, length_penalty

__all__ = ["SHARD_SCHEMA", "ShardTranslator", "mean_log_prob", "shard_name", "translate_shards"]

log = logging.getLogger(__name__)

SHARD_SCHEMA = pa.schema(
    [("src", pa.string()), ("tgt", pa.string()), ("score", pa.float64()), ("tgt_len", pa.int32())]
)
"""A translated shard: the source, its translation, the model's mean log-probability per
token of it (EOS counted), and its pieces (EOS not counted)."""


def shard_name(index: int) -> str:
    """The file of shard ``index``."""
    return f"part-{index:05d}.parquet"


def mean_log_prob(hyp: Hypothesis, decode: BeamSettings) -> float:
    """A hypothesis's log-probability per decoded position (its pieces and EOS), recovered from
    the search's length-penalised score (0 for an empty source's undecoded output)."""
    positions = len(hyp.tokens) + 1
    return hyp.score * length_penalty(positions, decode.alpha, decode.length_norm) / positions


class ShardTranslator:
    """Ray Data actor: loads the engine (``decode.engine``) and the tokenizer once, then
    translates whole shards (one input row each: ``shard``, ``src`` the sentences); one output
    row per sentence: ``shard``, ``row`` (in the shard), ``tgt``, ``score``, ``tgt_len`` and
    ``seconds`` (its share of the shard's time)."""

    def __init__(
        self,
        model_path: str,
        tokenizer_dir: str,
        decode: dict[str, Any],
        export_dir: str | None = None,
        fetch: Sequence[StoredFolder] = (),
    ):
        fetch_all(fetch)  # this node's copies of the inputs, at the paths the driver gave
        self.decode = DecodeConfig.from_dict(decode)
        self.translator = Translator.load(
            model_path, tokenizer_dir, self.decode, export_dir=export_dir
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, list[Any]] = {k: [] for k in ("shard", "row", "tgt", "score", "tgt_len")}
        seconds: list[float] = []
        for shard, texts in zip(batch["shard"], batch["src"], strict=True):
            started = time.perf_counter()
            texts = [str(t) for t in texts]
            best = [hyps[0] for hyps in self.translator.nbest_ids(self.translator.encode(texts), 1)]
            out["shard"] += [int(shard)] * len(texts)
            out["row"] += range(len(texts))
            out["tgt"] += self.translator.detokenize([h.tokens for h in best])
            out["score"] += [mean_log_prob(h, self.decode) for h in best]
            out["tgt_len"] += [len(h.tokens) for h in best]
            seconds += [(time.perf_counter() - started) / max(len(texts), 1)] * len(texts)
        return {
            "shard": np.asarray(out["shard"], dtype=np.int64),
            "row": np.asarray(out["row"], dtype=np.int64),
            "tgt": np.asarray(out["tgt"], dtype=object),
            "score": np.asarray(out["score"], dtype=np.float64),
            "tgt_len": np.asarray(out["tgt_len"], dtype=np.int32),
            "seconds": np.asarray(seconds, dtype=np.float64),
        }


@dataclasses.dataclass
class _Shard:
    """A shard being collected: its sentences and what came back of them so far."""

    src: list[str]
    tgt: list[str | None]
    score: list[float]
    tgt_len: list[int]
    missing: int


def translate_shards(
    model_path: Path,
    tokenizer_dir: Path,
    sources: Sequence[str],
    decode: DecodeConfig,
    out: Path,
    rows_per_shard: int,
    *,
    export_dir: Path | None = None,
    max_failures: int = 1,
    fetch: Sequence[StoredFolder] = (),
) -> dict[str, Any]:
    """Translate ``sources`` into the shards ``out/part-NNNNN.parquet`` (``SHARD_SCHEMA``) of
    ``rows_per_shard`` sentences, skipping the shards ``out`` holds already (Ray must be
    running); counts and timings. ``export_dir``: where engine ctranslate2 keeps its export.
    ``fetch``: the object-store folders the paths are this node's copies of."""
    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(sources), rows_per_shard)
    shards = [list(sources[i : i + rows_per_shard]) for i in starts]
    written = [k for k in range(len(shards)) if (out / shard_name(k)).is_file()]
    if written:
        log.info(
            "distill: %d of %d shards already translated in %s", len(written), len(shards), out
        )
    if decode.engine == "ctranslate2":  # once here, not racing in every actor
        from serving import ct2_export

        export_dir = export_dir or ct2_export.default_export_dir(model_path)
        ct2_export.export_ctranslate2(model_path, tokenizer_dir, export_dir, decode=decode)
    args = {
        "model_path": str(model_path),
        "tokenizer_dir": str(tokenizer_dir),
        "decode": dataclasses.asdict(decode),
        "export_dir": None if export_dir is None else str(export_dir),
        "fetch": tuple(fetch),
    }
    started, busy, restarts = time.perf_counter(), 0.0, 0
    while True:
        pending = [k for k in range(len(shards)) if not (out / shard_name(k)).is_file()]
        if not pending:
            break
        try:
            busy += _run_pool(shards, pending, args, out, decode.num_actors)
        except Exception as exc:
            if restarts >= max_failures or not worker_died(exc):
                raise
            restarts += 1
            log.warning(
                "distill: a translator died (%s); starting again on the shards not yet written "
                "(%d of %d)",
                type(exc).__name__,
                sum(not (out / shard_name(k)).is_file() for k in pending),
                len(shards),
            )
    seconds = time.perf_counter() - started
    translated = len(shards) - len(written)
    done = sum(len(shards[k]) for k in range(len(shards)) if k not in set(written))
    return {
        "sentences": len(sources),
        "shards": len(shards),
        "shards_reused": len(written),
        "shards_translated": translated,
        "restarts": restarts,
        "translate_seconds": round(seconds, 3),
        "sentences_per_s": round(done / seconds, 2) if done and seconds > 0 else None,
        "actor_seconds": round(busy, 3),
    }


def _run_pool(
    shards: list[list[str]], pending: list[int], args: dict[str, Any], out: Path, wanted: int
) -> float:
    """One pool over the ``pending`` shards, each written as soon as it is whole; the actors'
    own seconds."""
    import ray

    actors, resources = pool_size(wanted)
    items = [{"shard": k, "src": shards[k]} for k in pending]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        ShardTranslator,
        fn_constructor_kwargs=args,
        batch_size=1,  # one shard per call: its own batches, sorted by length
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_format="numpy",
        **resources,
        max_restarts=actor_pools.max_restarts(),
    )
    collecting: dict[int, _Shard] = {}
    busy = 0.0
    progress = Progress(sum(len(shards[k]) for k in pending), label="distill")
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            assert isinstance(batch, dict)  # Ray types a batch as any batch format's
            progress.update(len(batch["row"]))
            busy += float(batch["seconds"].sum())
            for k in _collect(collecting, shards, batch):
                _write_shard(out / shard_name(k), collecting.pop(k))
    finally:
        progress.close()
    return busy


def _collect(
    collecting: dict[int, _Shard], shards: list[list[str]], batch: dict[str, np.ndarray]
) -> list[int]:
    """Add a batch of translated rows to their shards; the shards now whole."""
    for k, row, tgt, score, n in zip(
        batch["shard"], batch["row"], batch["tgt"], batch["score"], batch["tgt_len"], strict=True
    ):
        k, row = int(k), int(row)
        if k not in collecting:
            size = len(shards[k])
            collecting[k] = _Shard(shards[k], [None] * size, [0.0] * size, [0] * size, size)
        shard = collecting[k]
        if shard.tgt[row] is None:
            shard.missing -= 1
        shard.tgt[row], shard.score[row], shard.tgt_len[row] = str(tgt), float(score), int(n)
    return [k for k, shard in collecting.items() if shard.missing == 0]


def _write_shard(path: Path, shard: _Shard) -> None:
    """The shard as Parquet, through a temporary file renamed into place."""
    import pyarrow.parquet as pq

    table = pa.table(
        {"src": shard.src, "tgt": shard.tgt, "score": shard.score, "tgt_len": shard.tgt_len},
        schema=SHARD_SCHEMA,
    )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


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
