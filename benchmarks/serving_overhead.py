"""Our serving overhead: the registered model on the CTranslate2 engine against raw CTranslate2.

Both translate the same text lines end to end (sentencepiece in, sentencepiece out) with the same
CTranslate2 model directory (our export of the checkpoint), compute type, threads, beam and
token budget, pass after pass, interleaved:

- ``registered``: the registry's pyfunc (``serving.pyfunc.TranslatorModel``) loaded with the
  artifacts a registered version holds, as ``mlflow.pyfunc.load_model`` and ``mlflow models
  serve`` load it, and its ``predict(texts)``: our batching, per-sentence output limits, GNMT
  re-ranking of the k hypotheses, detokenization.
- ``raw``: what a CTranslate2 user writes: ``sp.encode`` -> ``Translator.translate_batch``
  (the same beam, one output limit for the call, token-budget batches) -> ``sp.decode``, with
  the search our engine asks CTranslate2 for (our overhead alone), with the export's own
  ``translate_batch`` options (what its users get), and with CTranslate2's defaults (what
  exact GNMT scoring costs).

A trained model: by default the quickstart's (``make demo``) and its test set; with ``--refs``,
each path's BLEU too (the export's options against the pipeline's: docs/translation.md).

    python benchmarks/serving_overhead.py [--compute-type int8] [--threads 2] [--passes 5]
    python benchmarks/serving_overhead.py --checkpoint RUN/average --tokenizer RUN/tokenizer \\
        --texts RUN/clean/test.en --refs RUN/clean/test.de --compute-type float32 --passes 1 \\
        --config CONFIG   # the run's own decoding (beam, alpha), as its pipeline scored it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from serving import pyfunc, registered_version
from serving.ct2_export import export_ctranslate2, read_info
from serving.ct2_options import ct2_exponent
from serving.translator import DecodeConfig
from tasks.framework.config import load_config
from transformer_core import checkpoint
from transformer_core.search_settings import penalty_exponent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

RUN = Path("runs/quickstart")


def registered(folder: Path, weights: Path, tokenizer: Path, decode: DecodeConfig):
    """The pyfunc as MLflow loads a registered version: artifacts in, ``predict`` out."""
    (folder / "model_config.json").write_text(json.dumps(checkpoint.load(weights)["config"]))
    (folder / "decode.json").write_text(json.dumps(decode.__dict__))
    artifacts = {
        registered_version.ARTIFACT_WEIGHTS: str(weights),
        registered_version.ARTIFACT_TOKENIZER: str(tokenizer),
        registered_version.ARTIFACT_MODEL_CONFIG: str(folder / "model_config.json"),
        registered_version.ARTIFACT_DECODE: str(folder / "decode.json"),
        registered_version.ARTIFACT_CTRANSLATE2: str(
            export_ctranslate2(weights, tokenizer, folder / "ct2", decode=decode)
        ),
    }
    model = pyfunc.TranslatorModel()
    model.load_context(SimpleNamespace(artifacts=artifacts))
    return lambda texts: model.predict(None, texts), Path(
        artifacts[registered_version.ARTIFACT_CTRANSLATE2]
    )


RAW = {
    "raw, same search": "the call our engine makes",
    "raw, export.json": "the export's translate_batch options",
    "raw, CTranslate2 defaults": "CTranslate2's defaults",
}


def raw(export: Path, decode: DecodeConfig, mode: str):
    """Plain CTranslate2 and sentencepiece on the export, as its folder's files alone allow
    (the sentencepiece model and a pretokenization, ``tokenizer.prepare`` / ``restore`` being
    the sacremoses and subword-nmt steps docs/translation.md names). ``mode`` (``RAW``): the call
    our engine makes (its length penalty for GNMT's ranking near the median source length, k
    hypotheses kept and scored, <pad> and <s> suppressed, the longest source's output limit),
    so the difference is our code alone; ``export.json``'s ``translate_batch`` options, what a
    CTranslate2 user of the export writes; or CTranslate2's defaults with alpha as its length
    penalty (what GNMT-exact scoring costs on top)."""
    import ctranslate2

    from serving.tokenizer import load

    tok = load(export)  # the export holds the tokenizer files
    translator = ctranslate2.Translator(
        str(export), compute_type=decode.compute_type, intra_threads=decode.threads
    )
    exported = read_info(export)["translate_batch"]

    def translate(texts: list[str]) -> list[str]:
        pieces = tok.sp.encode(tok.prepare(texts), out_type=str)  # CTranslate2 appends EOS
        limit = max(map(len, pieces)) + 1 + decode.max_len_offset
        batching = {"max_batch_size": decode.max_tokens_per_batch, "batch_type": "tokens"}
        options = {
            "beam_size": decode.beam_size,
            "length_penalty": decode.alpha,
            "max_decoding_length": limit,
            **batching,
        }
        if mode == "raw, same search":
            median = sorted(map(len, pieces))[len(pieces) // 2] + 1
            p = penalty_exponent(decode.alpha, decode.length_norm, median)
            options |= {
                "length_penalty": ct2_exponent(p),
                "num_hypotheses": decode.beam_size,
                "return_scores": True,
                "suppress_sequences": [["<pad>"], ["<s>"]],
            }
        elif mode == "raw, export.json":
            options = exported
        results = translator.translate_batch(pieces, **options)
        return [tok.decode(tok.sp.piece_to_id(r.hypotheses[0])) for r in results]

    return translate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, default=RUN / "average" / "model.pt")
    parser.add_argument("--tokenizer", type=Path, default=RUN / "tokenizer")
    parser.add_argument("--texts", type=Path, default=RUN / "clean" / "test.en")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--refs",
        type=Path,
        default=None,
        help="references of --texts: each path's BLEU (bleu_sacre, bleu_tok_lc)",
    )
    parser.add_argument("--lang", default="de", help="the target language, for --refs")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a run config whose decode section (beam, alpha, length penalty, output limit) "
        "every path uses, as its pipeline decodes; default: DecodeConfig's defaults",
    )
    args = parser.parse_args()
    for path in (args.checkpoint, args.tokenizer, args.texts, *([args.refs] if args.refs else [])):
        if not path.exists():
            sys.exit(f"serving_overhead: {path} not found (run `make demo` first, or pass paths)")
    texts = args.texts.read_text(encoding="utf-8").splitlines()[: args.lines]
    refs = args.refs.read_text(encoding="utf-8").splitlines()[: args.lines] if args.refs else None
    own = load_config(args.config).decoding if args.config else DecodeConfig()
    decode = dataclasses.replace(
        own, engine="ctranslate2", compute_type=args.compute_type, threads=args.threads
    )
    with tempfile.TemporaryDirectory() as tmp:
        ours, export = registered(Path(tmp), args.checkpoint, args.tokenizer, decode)
        runners = {"registered": ours} | {mode: raw(export, decode, mode) for mode in RAW}
        outputs = {name: run(texts) for name, run in runners.items()}  # warm-up
        seconds: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.passes):
            for name, run in runners.items():
                started = time.perf_counter()
                run(texts)
                seconds[name].append(time.perf_counter() - started)
    raw_median = statistics.median(seconds["raw, same search"])
    rows = [
        {
            "path": name,
            "lines": len(texts),
            "compute_type": args.compute_type,
            "threads": args.threads,
            "median_s": statistics.median(times),
            "lines/s": len(texts) / statistics.median(times),
            "vs_raw_same_search": raw_median / statistics.median(times),
            "same_output": sum(
                a == b for a, b in zip(outputs[name], outputs["registered"], strict=True)
            )
            / len(texts),
            **bleu(outputs[name], refs, args.lang),
        }
        for name, times in seconds.items()
    ]
    report("Serving overhead: the registered model vs raw CTranslate2", rows, args.json)


def bleu(hyps: list[str], refs: list[str] | None, lang: str) -> dict[str, float]:
    """The scores the score stage reports (none without references)."""
    if refs is None:
        return {}
    from evaluation.bleu import score_texts

    scores = score_texts(hyps, refs, lang)
    return {"bleu_sacre": scores["bleu_sacre"], "bleu_tok_lc": scores["bleu_tok_lc"]}


if __name__ == "__main__":
    main()
