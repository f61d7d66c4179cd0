"""Stage translate: beam search over the test set with a Ray Data actor pool.

In: ``average`` (``model.pt``), ``tokenizer``, and the folder holding ``test.<src>`` (the
download stage's, or the linearize stage's in the parsing pipeline). Out: ``hyp.<tgt>``
(detokenized, one line per test segment, input order) and ``attention.png``. Decoding is
``config.decoding`` (beam 4, alpha 0.6, input + 50; the parsing pipeline's own settings there).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tasks.framework.config import RunConfig, to_dict
from tasks.framework.contract import BuildContext, StageError, read_manifest

log = logging.getLogger(__name__)

STAGE = "translate"
ATTENTION_PLOT = "attention.png"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The decoding settings and the language pair."""
    return {"decode": to_dict(config.decoding), "pair": config.data.pair}


def build(ctx: BuildContext) -> dict[str, Any]:
    """Translate ``<download>/test.<src>`` into ``ctx.tmp/hyp.<tgt>`` (one line per input line)."""
    from corpora.text import read_lines
    from evaluation.attention import plot_attention
    from serving import tokenizer
    from serving.batch import translate_distributed
    from serving.translator import encode_texts
    from tasks.framework.runtime import ensure_ray
    from transformer_core.checkpoint import model_file

    config, tmp = ctx.config, ctx.tmp
    src_lang, tgt_lang = config.languages
    decode = config.decoding
    average, tokenizer_dir, download = (ctx.inputs[k] for k in ("average", "tokenizer", "download"))
    source_file = download / f"test.{src_lang}"
    texts = read_lines(source_file)
    if not texts:
        raise StageError(f"{source_file} is empty (0 segments); nothing to translate")
    weights = model_file(average)
    if not weights.is_file():
        raise StageError(f"no checkpoint at {weights} (run `tfm stage average` first)")
    # The driver encodes only to plan batches; the actors load the model.
    src_ids = encode_texts(tokenizer.load(tokenizer_dir), texts)

    ensure_ray(config.ray)
    started = time.perf_counter()
    # Engine ctranslate2 keeps its export in the run's cache, never in the average folder.
    fingerprint = (read_manifest(average) or {}).get("fingerprint", "unknown")
    export_dir = config.root / "cache" / "ctranslate2" / fingerprint[:16]
    hyps, n_tokens, info = translate_distributed(weights, tokenizer_dir, src_ids, decode, export_dir)
    seconds = time.perf_counter() - started
    (tmp / f"hyp.{tgt_lang}").write_text("".join(h + "\n" for h in hyps), encoding="utf-8", newline="\n")
    out_tokens = int(sum(n_tokens))
    try:  # a picture for people; a failure here must not cost the decoded test set
        plotted = plot_attention(weights, tokenizer_dir, src_ids, hyps, tmp / ATTENTION_PLOT)
    except Exception as exc:  # noqa: BLE001
        log.warning("translate: no attention plot (%s: %s)", type(exc).__name__, exc)
        plotted = 0
    return {
        "attention_plot_sentences": plotted,
        "model_fingerprint": (read_manifest(average) or {}).get("fingerprint"),
        "decode": to_dict(decode),
        "source_file": source_file.name,
        "segments": len(hyps),
        "src_tokens": int(sum(len(s) for s in src_ids)),
        "hyp_tokens": out_tokens,
        # Wall time of the whole actor pool (start-up included) and the actors' own time.
        "decode_seconds": round(seconds, 3),
        "tokens_per_s": round(out_tokens / max(seconds, 1e-9), 2),
        "tokens_per_actor_s": round(out_tokens / max(info["actor_decode_seconds"], 1e-9), 2),
        **info,
    }
