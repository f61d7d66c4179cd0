"""The ``parse_score`` stage: repair each decoded sequence into a tree over its words and score
the trees against the gold test trees with EVALB's COLLINS.prm conventions (``tasks.evalb``).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.artifacts import StageError, read_manifest, run_stage
from tasks.config import RunConfig
from tasks.evalb import COLLINS, score_sentence, summarize
from tasks.linearize import repair
from tasks.treebank import read_trees, write_tree

__all__ = ["stage_config", "run", "read_lines"]

HYPOTHESES = "hyp.tree"
METRICS = ("precision", "recall", "f1", "exact_match", "tagging_accuracy", "f1_le40")


def stage_config(config: RunConfig) -> dict[str, Any]:
    """What the stage fingerprints: the target form and the scorer's parameters."""
    return {"form": config.parsing.form, "evalb": "COLLINS.prm"}


def read_lines(path: Path) -> list[str]:
    """Lines of a text file, split on ``\\n`` only (an empty line is an empty hypothesis)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def run(config: RunConfig, inputs: Mapping[str, Path], *, force: bool = False) -> Path:
    """Score ``translate/hyp.tree`` against ``linearize/gold.trees`` into ``<root>/parse_score/``:
    ``scores.json``, ``sentences.tsv`` and ``repaired.trees``."""
    for role in ("translate", "linearize"):
        if role not in inputs:
            raise StageError(f"the parse_score stage needs the input {role!r}")
    hyp_path = Path(inputs["translate"]) / HYPOTHESES
    gold_path = Path(inputs["linearize"]) / "gold.trees"
    words_path = Path(inputs["linearize"]) / "test.words"
    form = config.parsing.form

    def build(tmp: Path) -> dict[str, Any]:
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
            raise StageError(
                f"{words_path} has {len(sources)} lines, {gold_path} {len(golds)} trees"
            )
        scores, fix_totals, repaired_sentences = [], Counter(), 0
        with (
            open(tmp / "repaired.trees", "w", encoding="utf-8") as trees_out,
            open(tmp / "sentences.tsv", "w", encoding="utf-8") as tsv,
        ):
            tsv.write(
                "id\tlength\tstatus\tmatched\tgold\ttest\tprecision\trecall\tf1\t"
                "words\tcorrect_tags\ttag_accuracy\tfixes\n"
            )
            for i, (gold, hyp, src) in enumerate(zip(golds, hyps, sources, strict=True), start=1):
                # The vinyals form predicts no POS tags: the gold ones fill its XX slots.
                tags = gold.tags() if form == "vinyals" else None
                fixed = repair(hyp, src, form, tags=tags)
                result = score_sentence(gold, fixed.tree, COLLINS)
                scores.append(result)
                fix_totals.update(fixed.fixes)
                repaired_sentences += bool(fixed.fixes)
                trees_out.write(write_tree(fixed.tree) + "\n")
                fixes = ",".join(f"{k}={v}" for k, v in sorted(fixed.fixes.items())) or "-"
                tsv.write(
                    f"{i}\t{result.length}\t{result.status}\t{result.matched}\t{result.gold}\t"
                    f"{result.test}\t{result.precision:.2f}\t{result.recall:.2f}\t{result.f1:.2f}\t"
                    f"{result.words}\t{result.correct_tags}\t{result.tag_accuracy:.2f}\t{fixes}\n"
                )
        total = summarize(scores)
        stats = total.to_dict()
        stats["f1_le40"] = round(summarize(scores, COLLINS.cutoff_len).f1, 4)
        if form == "vinyals":
            stats["tagging_accuracy"] = None  # gold tags were filled in: nothing was predicted
        stats["repaired_sentences"] = repaired_sentences
        stats["fixes"] = dict(sorted(fix_totals.items()))
        stats["form"] = form
        (tmp / "scores.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
        return stats

    out = run_stage(
        "parse_score",
        config.root / "parse_score",
        stage_config(config),
        {"translate": Path(inputs["translate"]), "linearize": Path(inputs["linearize"])},
        build,
        force=force,
    )
    _log_mlflow((read_manifest(out) or {}).get("stats", {}))
    return out


def _log_mlflow(stats: dict[str, Any]) -> None:
    """Log the scores into the active MLflow run, if any."""
    mlflow = sys.modules.get("mlflow")  # never imported means no run can be active
    if mlflow is None or mlflow.active_run() is None:
        return
    metrics = {f"parse_{k}": float(stats[k]) for k in METRICS if stats.get(k) is not None}
    metrics["parse_length_errors"] = float(stats.get("length_errors", 0))
    metrics["parse_repaired_sentences"] = float(stats.get("repaired_sentences", 0))
    mlflow.log_metrics(metrics)
