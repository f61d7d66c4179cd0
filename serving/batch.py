"""Translating a whole test set on Ray: a Ray Data actor pool of ``Translator``s.

The driver cuts the encoded sentences into token-budget batches (``decode.max_tokens_per_batch``
source tokens, sorted by length); each planned batch is one Ray Data row. A pool of
``decode.num_actors`` actors (one GPU each when the cluster has GPUs) loads the model and the
tokenizer once and decodes whole batches. Every result carries its row index, so output i is
always the translation of input i.

With ``decode.engine: ctranslate2`` the driver exports the checkpoint once before the pool
starts (or finds the export already there); each actor then loads that export, once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from serving.translator import DecodeConfig, Translator, plan_decode_batches, restore_order

__all__ = ["BatchTranslator", "Progress", "translate_distributed"]

log = logging.getLogger(__name__)


class Progress:
    """Sentences translated so far: a tqdm bar for a person at a terminal, else (logs, CI) a
    plain line at every tenth of the total, with the rate, elapsed time and ETA."""

    def __init__(self, total: int, out: IO[str] | None = None, bar: bool | None = None):
        from tqdm import tqdm

        self.total, self.done, self.out = total, 0, out or sys.stderr
        if bar is None:
            bar = self.out.isatty() and os.environ.get("CI", "").lower() != "true"
        self.bar = tqdm(total=total, unit="sent", desc="translate", file=self.out) if bar else None
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
            f"translate {self.done}/{self.total} sentences ({100 * self.done / self.total:.0f}%)"
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
    """Ray Data actor: loads the engine (``decode.engine``) and tokenizer once, decodes planned
    batches.

    Each input row is one planned batch (``idx``: row indices, ``src_ids``: their token ids);
    the output has one row per sentence: ``idx``, ``hyp`` (text), ``hyp_tokens`` and ``seconds``
    (its share of its batch's decoding time).
    """

    def __init__(
        self, model_path: str, tokenizer_dir: str, decode: dict[str, Any], export_dir: str | None = None
    ):
        self.translator = Translator.load(
            model_path, tokenizer_dir, DecodeConfig.from_dict(decode), export_dir=export_dir
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idx: list[int] = []
        hyps: list[str] = []
        n_tokens: list[int] = []
        seconds: list[float] = []
        for rows, src_ids in zip(batch["idx"], batch["src_ids"], strict=True):
            started = time.perf_counter()
            out = self.translator.translate_batch([[int(t) for t in seq] for seq in src_ids])
            idx.extend(int(i) for i in rows)
            hyps.extend(self.translator.detokenize(out))
            n_tokens.extend(len(seq) for seq in out)
            seconds.extend([(time.perf_counter() - started) / len(rows)] * len(rows))
        return {
            "idx": np.asarray(idx, dtype=np.int64),
            "hyp": np.asarray(hyps, dtype=object),
            "hyp_tokens": np.asarray(n_tokens, dtype=np.int64),
            "seconds": np.asarray(seconds, dtype=np.float64),
        }


def translate_distributed(
    model_path: Path,
    tokenizer_dir: Path,
    src_ids: Sequence[Sequence[int]],
    decode: DecodeConfig,
    export_dir: Path | None = None,
) -> tuple[list[str], list[int], dict[str, Any]]:
    """Decode ``src_ids`` with a Ray Data actor pool (Ray must be running); (texts, output
    token counts, run info), in input order. ``export_dir``: where engine ctranslate2 keeps its
    export (default: next to the checkpoint)."""
    import ray

    if decode.engine == "ctranslate2":
        # Once here rather than racing in every actor: the actors find it and only load it.
        from serving import ct2_export

        export_dir = export_dir or ct2_export.default_export_dir(model_path)
        ct2_export.export_ctranslate2(model_path, tokenizer_dir, export_dir)
    batches = plan_decode_batches([len(s) for s in src_ids], decode.max_tokens_per_batch)
    items = [
        {"idx": rows.tolist(), "src_ids": [list(map(int, src_ids[i])) for i in rows]}
        for rows in batches
    ]
    cluster = ray.cluster_resources()
    gpus = int(cluster.get("GPU", 0))
    resources: dict[str, Any] = {}
    # One GPU (or one CPU) per actor; more actors than the cluster holds would wait forever.
    if gpus:
        actors = min(decode.num_actors, gpus)
        resources["num_gpus"] = 1
    else:
        actors = max(1, min(decode.num_actors, int(cluster.get("CPU", 1))))
    if actors != decode.num_actors:
        log.warning(
            "translate: %d actors instead of %d (cluster resources)", actors, decode.num_actors
        )
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        BatchTranslator,
        fn_constructor_kwargs={
            "model_path": str(model_path),
            "tokenizer_dir": str(tokenizer_dir),
            "decode": dataclasses.asdict(decode),
            "export_dir": None if export_dir is None else str(export_dir),
        },
        batch_size=1,  # one planned batch per call: the plan already holds the token budget
        compute=ray.data.ActorPoolStrategy(size=actors),
        batch_format="numpy",
        **resources,
    )
    idx: list[int] = []
    hyps: list[str] = []
    counts: list[int] = []
    busy = 0.0
    progress = Progress(len(src_ids))
    for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
        progress.update(len(out["idx"]))
        idx.extend(int(i) for i in out["idx"])
        hyps.extend(str(h) for h in out["hyp"])
        counts.extend(int(c) for c in out["hyp_tokens"])
        busy += float(out["seconds"].sum())
    progress.close()
    # restore_order checks every row came back exactly once.
    texts = restore_order([idx], [hyps], len(src_ids))
    n_tokens = restore_order([idx], [counts], len(src_ids))
    info = {
        "actors": actors,
        "gpus_per_actor": 1 if gpus else 0,
        "batches": len(batches),
        "actor_decode_seconds": round(busy, 3),
    }
    return texts, n_tokens, info
