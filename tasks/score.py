"""Stage score: BLEU of the test-set translations (``evaluation.bleu``: sacreBLEU and the
paper's tokenized BLEU, never confused) and chrF.

In: ``translate`` (``hyp.<tgt>``), and the folder holding ``test.<src>``/``test.<tgt>``. Out:
``scores.json`` (scores, signatures, the test set), ``sentences.tsv`` (one row per segment, with
sentence BLEU) and ``bleu_by_length.png`` (sacreBLEU per source-length bucket).
"""

from __future__ import annotations

import json
import logging
from importlib import metadata
from typing import Any

from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

log = logging.getLogger(__name__)

STAGE = "score"
SCORES_FILE = "scores.json"
SENTENCES_FILE = "sentences.tsv"
PLOT_FILE = "bleu_by_length.png"


def test_set(config: RunConfig) -> tuple[str, str]:
    """(name, variant) of the test set the scores are on: the synthetic corpus's own test split
    is named as such, never as the newstest release the config names for real downloads."""
    if config.data.source == "synthetic":
        return "synthetic", "synthetic"
    return config.data.eval_sets[1], config.data.test_variant


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The pair, the test set, and the metric libraries' versions."""
    test, variant = test_set(config)
    return {
        "pair": config.data.pair,
        "test": test,
        "test_variant": variant,
        "sacrebleu": metadata.version("sacrebleu"),
        "sacremoses": metadata.version("sacremoses"),
    }


def build(ctx: BuildContext) -> dict[str, Any]:
    """Score ``<translate>/hyp.<tgt>`` against ``<download>/test.<tgt>`` into ``ctx.tmp``."""
    from corpora.text import read_lines
    from evaluation import bleu

    config, tmp = ctx.config, ctx.tmp
    src_lang, tgt_lang = config.languages
    translate, download = ctx.inputs["translate"], ctx.inputs["download"]
    hyp_file, ref_file, src_file = (
        translate / f"hyp.{tgt_lang}",
        download / f"test.{tgt_lang}",
        download / f"test.{src_lang}",
    )
    hyps, refs, sources = read_lines(hyp_file), read_lines(ref_file), read_lines(src_file)
    if not refs:
        raise StageError(f"the test set {ref_file} is empty (0 segments)")
    if len(hyps) != len(refs):
        raise StageError(
            f"{hyp_file} has {len(hyps)} lines but {ref_file} has {len(refs)}; "
            "every reference needs exactly one hypothesis"
        )
    if len(sources) != len(refs):
        raise StageError(f"{src_file} has {len(sources)} lines but {ref_file} has {len(refs)}")
    scores = bleu.score_texts(hyps, refs, tgt_lang)
    test_name, test_variant = test_set(config)
    by_length = bleu.bleu_by_length(sources, hyps, refs, tgt_lang)
    result = {
        **scores,
        "test_set": test_name,
        "test_variant": test_variant,
        "test_segments": len(refs),
        "pair": config.data.pair,
        # The protocol key the register stage compares champions on.
        "signature": scores["bleu_sacre_signature"],
        "bleu_by_length": by_length,
    }
    (tmp / SCORES_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    bleu.write_sentences(
        tmp / SENTENCES_FILE, sources, refs, hyps, bleu.sentence_bleu(hyps, refs, tgt_lang)
    )
    bleu.plot_bleu_by_length(
        by_length,
        tmp / PLOT_FILE,
        f"{test_name} ({test_variant}) {config.data.pair}: BLEU {scores['bleu_sacre']:.2f}",
    )
    log.info(
        "score: bleu_sacre %.2f, bleu_tok_compound %.2f, bleu_tok_lc %.2f, chrf %.2f on %d "
        "segments",
        scores["bleu_sacre"],
        scores["bleu_tok_compound"],
        scores["bleu_tok_lc"],
        scores["chrf"],
        len(refs),
    )
    return {k: result[k] for k in (*bleu.METRICS, "test_set", "test_segments", "signature")}
