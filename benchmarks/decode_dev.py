"""Decoding settings chosen on dev: BLEU of a finished run's model for each beam size and alpha.

A fair comparison chooses the decoding settings (beam size, GNMT's length penalty alpha) on the
dev split and scores test once, with the chosen ones, through the pipeline. This loads a run's
averaged model (the average stage's folder, or ``--model``) and its tokenizer, translates the
clean stage's source side of the split once per setting, and scores the output against the
downloaded references with the score stage's metrics (``evaluation.bleu.score_texts``):
``bleu_tok_lc`` (Moses-tokenized, lowercased), ``bleu_sacre``, chrF and the length ratio.

    python benchmarks/decode_dev.py configs/multi30k_en_de_tiny.yaml --beams 5 \\
        --alphas 1.0,1.5,2.0,2.5,3.0 [--set key=value ...] [--model PATH] [--json out.json]

``--split test`` decodes test the same way; the pipeline's own score is that of the config's
settings, so it is for checking this script against the pipeline, or for the one test figure
of a setting declared before it was decoded (docs/multi30k.md), never for choosing.
Hand-written because it is a loop over two library calls (the translator, sacrebleu).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse_overrides, report  # noqa: E402


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def sweep(
    config_path: str | Path,
    overrides: dict[str, object] | None = None,
    *,
    split: str = "dev",
    beams: list[int] | None = None,
    alphas: list[float] | None = None,
    model: str | Path | None = None,
) -> list[dict]:
    """One row per (beam, alpha): the split's scores with those settings, the rest of the
    config's ``decode`` section unchanged; ``beams``/``alphas`` default to the config's own."""
    from corpora.text import read_lines
    from evaluation.bleu import score_texts
    from serving.translator import Translator
    from tasks.framework.config import load_config
    from transformer_core.config_checks import ConfigError

    try:
        config = load_config(config_path, overrides)
    except ConfigError as exc:
        raise SystemExit(f"decode_dev: {exc}") from None
    if config.store.remote:
        raise SystemExit(f"decode_dev: {config.workdir} is a bucket; this reads a local work dir")
    root, (src, tgt) = config.root, config.languages
    weights = Path(model) if model else root / "average"
    needed = [
        weights,
        root / "tokenizer",
        root / "clean" / f"{split}.{src}",
        root / "download" / f"{split}.{tgt}",
    ]
    for path in needed:
        if not path.exists():
            raise SystemExit(
                f"decode_dev: {path} does not exist (run `tfm run {config_path}` first)"
            )
    sources, refs = read_lines(needed[2]), read_lines(needed[3])
    if len(sources) != len(refs):
        raise SystemExit(
            f"decode_dev: {needed[2]} has {len(sources)} lines but {needed[3]} has {len(refs)}"
        )
    own = config.decoding
    translator = Translator.load(weights, root / "tokenizer", own)
    rows = []
    for beam in beams or [own.beam_size]:
        for alpha in alphas or [own.alpha]:
            translator.decode = dataclasses.replace(own, beam_size=beam, alpha=alpha)
            started = time.perf_counter()
            hyps = translator.translate(sources)
            seconds = time.perf_counter() - started
            scores = score_texts(hyps, refs, tgt)
            details = scores["bleu_sacre_details"]
            rows.append(
                {
                    "split": split,
                    "beam": beam,
                    "alpha": alpha,
                    "length_norm": own.length_norm,
                    "config's": "*" if (beam, alpha) == (own.beam_size, own.alpha) else "",
                    "bleu_tok_lc": round(scores["bleu_tok_lc"], 2),
                    "bleu_sacre": round(scores["bleu_sacre"], 2),
                    "chrf": round(scores["chrf"], 2),
                    "length_ratio": round(details["sys_len"] / details["ref_len"], 3),
                    "segments": len(hyps),
                    "seconds": round(seconds, 1),
                }
            )
            print(
                f"{split} beam {beam} alpha {alpha}: bleu_tok_lc {scores['bleu_tok_lc']:.2f} "
                f"({seconds:.0f} s)",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", help="the run's config (its work dir holds the finished stages)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as `tfm run --set` (the same ones the run was given)",
    )
    parser.add_argument("--split", default="dev", choices=["dev", "test"])
    parser.add_argument(
        "--beams", type=ints, default=None, help="comma-separated; default the config's"
    )
    parser.add_argument(
        "--alphas", type=floats, default=None, help="comma-separated; default the config's"
    )
    parser.add_argument(
        "--model", default=None, help="model.pt or a folder holding it; default <workdir>/average"
    )
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = sweep(
        args.config,
        parse_overrides(args.overrides),
        split=args.split,
        beams=args.beams,
        alphas=args.alphas,
        model=args.model,
    )
    report(f"Decoding settings on {args.split}: {args.config}", rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
