"""Stage translate: beam search over the test set with a Ray Data actor pool.

In: ``average`` (``model.pt``), ``tokenizer``, and ``shard``, whose ``test/part-*.parquet`` is the
test source already cleaned (the clean or linearize stage) and encoded, line for line. Out:
``hyp.<tgt>`` (detokenized, one line per test segment, input order) and ``attention.png``.
Decoding is ``config.decoding`` (beam 4, alpha 0.6, input + 50; the parsing pipeline's own
settings there). The driver reads the source lengths only, to plan the batches; the actors read
the ids, translate, and compute the attention maps with the model they hold.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "translate"
ATTENTION_PLOT = "attention.png"
ATTENTION_SENTENCES = 4
"""Sentences drawn in ``attention.png``: the first whose source and translation are short."""
ATTENTION_CANDIDATES = 64
"""The first this many short test sources are the plot's candidates: the actors map those whose
translation is short too, so a long test set costs no more than these forward passes."""


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The decoding settings and the language pair."""
    return {"decode": to_dict(config.decoding), "pair": config.data.pair}


def build(ctx: BuildContext) -> dict[str, Any]:
    """Translate the shard stage's test split into ``ctx.tmp/hyp.<tgt>`` (one line per input
    line)."""
    from corpora.parquet import part_files
    from evaluation.attention import AttentionMap, attention_map, draw_attention, short_enough
    from filesystem.storage import StoredPath
    from serving.corpus_translation import read_lengths, translate_split
    from tasks.framework.runtime import ensure_ray
    from transformer_core.checkpoint import model_file

    config, tmp = ctx.config, ctx.tmp
    tgt_lang = config.languages[1]
    decode = config.decoding
    average, shard = ctx.inputs["average"], ctx.inputs["shard"]
    source = part_files(shard / "test")
    lengths = read_lengths(source)
    if not len(lengths):
        raise StageError(f"{shard / 'test'} holds 0 rows (an empty test set); nothing to translate")
    weights = model_file(average)
    if not weights.is_file():
        raise StageError(f"no checkpoint at {weights} (run `tfm stage average` first)")
    model_fingerprint = ctx.input_fps["average"]
    candidates = [i for i, n in enumerate(lengths) if short_enough(int(n))][:ATTENTION_CANDIDATES]

    ensure_ray(config.ray)
    started = time.perf_counter()
    # Engine ctranslate2 keeps its export in the run's node-local cache, never in the average
    # folder. The actors read each node's copies of the inputs.
    export_dir = ctx.workdir.node_path(f"cache/ctranslate2/{model_fingerprint[:16]}")
    stored = ctx.stored
    decoded = translate_split(
        stored["average"] / weights.name,
        StoredPath(stored["tokenizer"]),
        [stored["shard"] / f"test/{f.name}" for f in source],
        decode,
        export_dir,
        lengths=lengths,
        probe=attention_map,
        probe_rows=candidates,
    )
    seconds = time.perf_counter() - started
    hyps = decoded.hyps
    (tmp / f"hyp.{tgt_lang}").write_text(
        "".join(h + "\n" for h in hyps), encoding="utf-8", newline="\n"
    )
    out_tokens = int(sum(decoded.hyp_tokens))
    maps = [m for _, m in sorted(decoded.probes.items()) if isinstance(m, AttentionMap)]
    try:  # a picture for people; a failure here must not cost the decoded test set
        plotted = draw_attention(maps[:ATTENTION_SENTENCES], tmp / ATTENTION_PLOT)
    except Exception as exc:  # noqa: BLE001
        log.warning("translate: no attention plot (%s: %s)", type(exc).__name__, exc)
        plotted = 0
    return {
        "attention_plot_sentences": plotted,
        "model_fingerprint": model_fingerprint,
        "decode": to_dict(decode),
        "source_files": [f"test/{f.name}" for f in source],
        "segments": len(hyps),
        "src_tokens": int(lengths.sum()),
        "hyp_tokens": out_tokens,
        # Wall time of the whole actor pool (start-up included) and the actors' own time.
        "decode_seconds": round(seconds, 3),
        "tokens_per_s": round(out_tokens / max(seconds, 1e-9), 2),
        "tokens_per_actor_s": round(
            out_tokens / max(decoded.info["actor_decode_seconds"], 1e-9), 2
        ),
        **decoded.info,
    }
