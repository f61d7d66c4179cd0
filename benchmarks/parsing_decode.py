"""One trained parser decoded several ways: a finished run's averaged model on dev or test, with
the pipeline's Translator, repair and EVALB rules, one JSON line per decoding setting.

Each setting is ``beam:alpha:mode``, mode ``plain`` (no constraint), ``tree`` (brackets and slot
count only) or ``full`` (``parsing.constrained``: also punctuation tags).

    python benchmarks/parsing_decode.py runs/bench_parsing test 21:0.3:full 21:0.3:plain 1:0.3:plain
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("plain", "tree", "full")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", help="a parsing run's folder (average/, tokenizer/, ...)")
    parser.add_argument("split", choices=("dev", "test"))
    parser.add_argument("settings", nargs="+", metavar="BEAM:ALPHA:MODE")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from evaluation.evalb import score_corpus
    from parsing.linearize import POS_TAGS, repair, structure_tokens
    from parsing.trees import read_trees
    from serving.translator import DecodeConfig, Translator

    torch.set_num_threads(args.threads)
    root = Path(args.workdir)
    words = (root / "linearize" / f"{args.split}.words").read_text(encoding="utf-8").splitlines()
    golds = list(read_trees(root / "treebank" / f"{args.split}.trees"))
    gold_tokens = sum(
        len(line.split())
        for line in (root / "linearize" / f"{args.split}.tree").read_text().splitlines()
    )
    n_words = sum(len(w.split()) for w in words)
    manifest = json.loads((root / "linearize" / "manifest.json").read_text(encoding="utf-8"))
    form = manifest["stats"]["form"]
    for setting in args.settings:
        beam, alpha, mode = setting.split(":")
        if mode not in MODES:
            raise SystemExit(f"{setting}: the mode must be one of {', '.join(MODES)}")
        decode = DecodeConfig(
            beam_size=int(beam),
            alpha=float(alpha),
            max_len_offset=300,
            tree_constraint=None if mode == "plain" else form,
        )
        translator = Translator.load(root / "average", root / "tokenizer", decode, device="cpu")
        if mode == "tree":  # the same constraint without the punctuation classes
            translator.engine.constraint = dataclasses.replace(
                translator.engine.constraint, leaf_class=None, word_class=None
            )
        started = time.perf_counter()
        hyps = translator.translate(words)
        seconds = time.perf_counter() - started
        fixed = [
            repair(h, w, form, tags=g.tags() if form == "vinyals" else None)
            for h, w, g in zip(hyps, words, golds, strict=True)
        ]
        total, _ = score_corpus(golds, [r.tree for r in fixed])
        slots = [sum(t in POS_TAGS for t in structure_tokens(h, form)) for h in hyps]
        row = {
            "split": args.split,
            "beam": int(beam),
            "alpha": float(alpha),
            "mode": mode,
            "f1": round(total.f1, 2),
            "precision": round(total.precision, 2),
            "recall": round(total.recall, 2),
            "exact_match": round(total.exact_match, 2),
            "tagging": round(total.tagging_accuracy, 2),
            "length_errors": total.errors,
            "slots_per_word": round(sum(slots) / n_words, 4),
            "short_outputs": sum(s < len(w.split()) for s, w in zip(slots, words, strict=True)),
            "tokens_over_gold": round(sum(len(h.split()) for h in hyps) / gold_tokens, 4),
            "repaired": sum(bool(r.fixes) for r in fixed),
            "seconds": round(seconds, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
