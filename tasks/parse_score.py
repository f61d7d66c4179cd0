"""Stage parse_score: repair each decoded sequence into a tree over its words
(``parsing.linearize.repair``) and score the trees against the gold test trees with EVALB's
COLLINS.prm conventions (``evaluation.evalb``).

In: ``translate`` (``hyp.tree``), ``linearize`` (``gold.trees``, ``test.words``). Out:
``scores.json``, ``sentences.tsv`` (EVALB's per-sentence table, with the repairs made) and
``repaired.trees``. Like EVALB with COLLINS.prm (MAX_ERROR 10), the stage gives up at the 12th
length or word mismatch (``parsing.evalb_max_error``; null scores every sentence).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from tasks.framework.config import RunConfig
from tasks.framework.contract import BuildContext
from tasks.framework.results import StageError

STAGE = "parse_score"
HYPOTHESES = "hyp.tree"


def stage_config(config: RunConfig) -> dict[str, Any]:
    """The target form and the scorer's parameters."""
    return {
        "form": config.parsing.form,
        "evalb": "COLLINS.prm",
        "max_error": config.parsing.evalb_max_error,
    }


def build(ctx: BuildContext) -> dict[str, Any]:
    """Score ``translate/hyp.tree`` against ``linearize/gold.trees`` into ``ctx.tmp``:
    ``scores.json``, ``sentences.tsv`` and ``repaired.trees``."""
    from corpora.text import read_lines
    from evaluation.evalb import COLLINS, TooManyErrors, score_corpus, summarize
    from parsing.linearize import repair
    from parsing.trees import read_trees, write_tree

    config, tmp = ctx.config, ctx.tmp
    hyp_path = ctx.inputs["translate"] / HYPOTHESES
    gold_path = ctx.inputs["linearize"] / "gold.trees"
    words_path = ctx.inputs["linearize"] / "test.words"
    form = config.parsing.form

    for path in (hyp_path, gold_path, words_path):
        if not path.is_file():
            raise StageError(f"{path} is missing")
    golds = list(read_trees(gold_path))
    hyps = read_lines(hyp_path)
    sources = read_lines(words_path)
    if len(hyps) != len(golds):
        raise StageError(
            f"{hyp_path} has {len(hyps)} lines but {gold_path} has {len(golds)} trees: "
            "the hypotheses must be one per test sentence, in order"
        )
    if len(sources) != len(golds):
        raise StageError(f"{words_path} has {len(sources)} lines, {gold_path} {len(golds)} trees")
    # The vinyals form predicts no POS tags: the gold ones fill its XX slots.
    repaired = [
        repair(hyp, src, form, tags=gold.tags() if form == "vinyals" else None)
        for gold, hyp, src in zip(golds, hyps, sources, strict=True)
    ]
    params = dataclasses.replace(COLLINS, max_error=config.parsing.evalb_max_error)
    try:
        total, scores = score_corpus(golds, [r.tree for r in repaired], params)
    except TooManyErrors as exc:
        raise StageError(
            f"{exc}; set parsing.evalb_max_error: null to score every sentence"
        ) from None
    (tmp / "repaired.trees").write_text(
        "".join(write_tree(r.tree) + "\n" for r in repaired), encoding="utf-8"
    )
    with open(tmp / "sentences.tsv", "w", encoding="utf-8") as tsv:
        tsv.write(
            "id\tlength\tstatus\tmatched\tgold\ttest\tprecision\trecall\tf1\t"
            "words\tcorrect_tags\ttag_accuracy\tfixes\n"
        )
        for i, (result, fixed) in enumerate(zip(scores, repaired, strict=True), start=1):
            fixes = ",".join(f"{k}={v}" for k, v in sorted(fixed.fixes.items())) or "-"
            tsv.write(
                f"{i}\t{result.length}\t{result.status}\t{result.matched}\t{result.gold}\t"
                f"{result.test}\t{result.precision:.2f}\t{result.recall:.2f}\t{result.f1:.2f}\t"
                f"{result.words}\t{result.correct_tags}\t{result.tagging_accuracy:.2f}\t{fixes}\n"
            )
    stats = total.to_dict()
    stats["f1_le40"] = round(summarize(scores, COLLINS.cutoff_len).f1, 4)
    if form == "vinyals":
        stats["tagging_accuracy"] = None  # gold tags were filled in: nothing was predicted
    stats["repaired_sentences"] = sum(bool(r.fixes) for r in repaired)
    stats["fixes"] = dict(sorted(sum((Counter(r.fixes) for r in repaired), Counter()).items()))
    stats["form"] = form
    (tmp / "scores.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats
