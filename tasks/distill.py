"""Stage distill: the teacher translates the training corpus's source side (sequence-level
knowledge distillation, Kim and Rush 2016).

In: ``teacher`` (its weights, tokenizer and decoding), ``clean`` (``train/part-*.parquet``).
Out: ``train/part-*.parquet``, one per shard of ``distill.rows_per_shard`` sentences in corpus
order: ``src``, ``tgt`` (the teacher's translation, detokenized), ``score`` (the teacher's
mean log-probability per token of it) and ``tgt_len``. The teacher decodes as
``distill.decode`` says, else as it was registered. The work is
``serving.corpus_translation``'s: a Ray Data actor pool, each shard batched by length, and
every finished shard written at once to a folder outside the stage's temporary one, keyed by
the stage's fingerprint (``<run>/cache/distill/<key>``), so a killed run resumes with the
shards it has not written; the folder's files become the stage's (hard links) and it is
removed when the stage is done.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError
from tasks.framework.stage_fingerprint import stage_fingerprint

log = logging.getLogger(__name__)

STAGE = "distill"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The teacher's decoding (null: as registered, in the teacher folder), the shard size
    (what a shard is) and the pair."""
    d = config.distill
    return {
        "decode": to_dict(d.decode),
        "rows_per_shard": d.rows_per_shard,
        "pair": config.data.pair,
    }


def resume_folder(ctx: BuildContext) -> Path:
    """Where the shards of this identity are kept while the stage runs (the run's node-local
    folder: an object-store work dir's too)."""
    key = stage_fingerprint(STAGE, stage_config(ctx.config), ctx.input_fps)
    return ctx.workdir.node_path(f"cache/{STAGE}/{key[:16]}")


def build(ctx: BuildContext) -> dict[str, Any]:
    """Translate ``inputs["clean"]``'s sources with ``inputs["teacher"]`` into ``ctx.tmp/train``."""
    import pyarrow.parquet as pq

    from corpora.parquet import part_files
    from serving.corpus_translation import translate_shards
    from serving.translated_shards import shard_name
    from serving.translator import DecodeConfig
    from tasks.framework.runtime import ensure_ray
    from transformer_core.checkpoint import MODEL_FILE

    config, teacher = ctx.config, ctx.inputs["teacher"]
    record = json.loads((teacher / "teacher.json").read_text(encoding="utf-8"))
    decode = config.distill.decode or DecodeConfig.from_dict(
        json.loads((teacher / "decode.json").read_text(encoding="utf-8"))
    )
    sources = [
        str(s)
        for f in part_files(ctx.inputs["clean"] / "train")
        for s in pq.read_table(f, columns=["src"]).column("src").to_pylist()
    ]
    if not sources:
        raise StageError(f"{ctx.inputs['clean'] / 'train'} holds no sentences to translate")
    ensure_ray(config.ray)
    resume = resume_folder(ctx)
    stored = ctx.stored["teacher"]  # each actor reads its node's copy
    stats = translate_shards(
        stored / MODEL_FILE,
        stored / "tokenizer",
        sources,
        decode,
        resume,
        config.distill.rows_per_shard,
        export_dir=ctx.workdir.node_path(f"cache/ctranslate2/{ctx.input_fps['teacher'][:16]}"),
        max_failures=config.distill.max_failures,
    )
    out = ctx.tmp / "train"
    out.mkdir()
    scores = []
    for k in range(stats["shards"]):
        _link(resume / shard_name(k), out / shard_name(k))
        scores.append(pq.read_table(out / shard_name(k), columns=["score"]).column("score"))
    shutil.rmtree(resume)  # its files live on in the stage's folder
    mean = sum(float(c.to_numpy().sum()) for c in scores) / len(sources)
    log.info(
        "distill: %d sentences in %d shards (%d reused from a killed run), %s sentences/s",
        stats["sentences"],
        stats["shards"],
        stats["shards_reused"],
        stats["sentences_per_s"],
    )
    return {
        **stats,
        "teacher": record["name"],
        "teacher_version": record["version"],
        "decode": to_dict(decode),
        "mean_score": round(mean, 4),
    }


def _link(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (the same bytes, not copied), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
