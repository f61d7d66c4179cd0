"""Our serving overhead: the registered model on the CTranslate2 engine against raw CTranslate2.

Both translate the same text lines end to end (sentencepiece in, sentencepiece out) with the same
CTranslate2 model directory (our export of the checkpoint), compute type, threads, beam and
token budget, pass after pass, interleaved:

- ``registered``: the registry's pyfunc (``serving.pyfunc.TranslatorModel``) loaded with the
  artifacts a registered version holds, as ``mlflow.pyfunc.load_model`` and ``mlflow models
  serve`` load it, and its ``predict(texts)``: our batching, per-sentence output limits, GNMT
  re-ranking of the k hypotheses, detokenization.
- ``raw``: what a CTranslate2 user writes: ``sp.encode`` -> ``Translator.translate_batch``
  (the same beam, one output limit for the call, token-budget batches) -> ``sp.decode``, once
  with the search our engine asks CTranslate2 for (our overhead alone) and once with
  CTranslate2's defaults (what exact GNMT scoring costs).

A trained model: by default the quickstart's (``make demo``) and its test set.

    python benchmarks/serving_overhead.py [--compute-type int8] [--threads 2] [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from serving import pyfunc
from serving.ct2 import _penalty
from serving.ct2_export import export_ctranslate2
from serving.translator import DecodeConfig
from transformer_core import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

RUN = Path("runs/quickstart")


def registered(folder: Path, weights: Path, tokenizer: Path, decode: DecodeConfig):
    """The pyfunc as MLflow loads a registered version: artifacts in, ``predict`` out."""
    (folder / "model_config.json").write_text(json.dumps(checkpoint.load(weights)["config"]))
    (folder / "decode.json").write_text(json.dumps(decode.__dict__))
    artifacts = {
        pyfunc.ARTIFACT_WEIGHTS: str(weights),
        pyfunc.ARTIFACT_TOKENIZER: str(tokenizer),
        pyfunc.ARTIFACT_MODEL_CONFIG: str(folder / "model_config.json"),
        pyfunc.ARTIFACT_DECODE: str(folder / "decode.json"),
        pyfunc.ARTIFACT_CTRANSLATE2: str(export_ctranslate2(weights, tokenizer, folder / "ct2")),
    }
    model = pyfunc.TranslatorModel()
    model.load_context(SimpleNamespace(artifacts=artifacts))
    return lambda texts: model.predict(None, texts), Path(artifacts[pyfunc.ARTIFACT_CTRANSLATE2])


def raw(export: Path, tokenizer: Path, decode: DecodeConfig, same_search: bool):
    """Plain CTranslate2 and sentencepiece on the same export. ``same_search``: the call our
    engine makes (its length penalty for GNMT's ranking, k hypotheses kept and scored, <pad>
    and <s> suppressed), so the difference is our code alone; else CTranslate2's defaults with
    alpha as its length penalty and one hypothesis (what GNMT-exact scoring costs on top)."""
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer / "spm.model"))
    translator = ctranslate2.Translator(
        str(export), compute_type=decode.compute_type, intra_threads=decode.threads
    )

    def translate(texts: list[str]) -> list[str]:
        pieces = [p + ["</s>"] for p in sp.encode(texts, out_type=str)]
        options = {"length_penalty": decode.alpha}
        if same_search:
            median = sorted(map(len, pieces))[len(pieces) // 2]
            options = {
                "length_penalty": _penalty(decode.alpha, median),
                "num_hypotheses": decode.beam_size,
                "return_scores": True,
                "suppress_sequences": [["<pad>"], ["<s>"]],
            }
        results = translator.translate_batch(
            pieces,
            beam_size=decode.beam_size,
            max_decoding_length=max(map(len, pieces)) + decode.max_len_offset,
            max_batch_size=decode.max_tokens_per_batch,
            batch_type="tokens",
            **options,
        )
        return [sp.decode(r.hypotheses[0]) for r in results]

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
    args = parser.parse_args()
    for path in (args.checkpoint, args.tokenizer, args.texts):
        if not path.exists():
            sys.exit(f"serving_overhead: {path} not found (run `make demo` first, or pass paths)")
    texts = args.texts.read_text(encoding="utf-8").splitlines()[: args.lines]
    decode = DecodeConfig(
        engine="ctranslate2", compute_type=args.compute_type, threads=args.threads
    )
    with tempfile.TemporaryDirectory() as tmp:
        ours, export = registered(Path(tmp), args.checkpoint, args.tokenizer, decode)
        runners = {
            "registered": ours,
            "raw, same search": raw(export, args.tokenizer, decode, same_search=True),
            "raw, CTranslate2 defaults": raw(export, args.tokenizer, decode, same_search=False),
        }
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
        }
        for name, times in seconds.items()
    ]
    report("Serving overhead: the registered model vs raw CTranslate2", rows, args.json)


if __name__ == "__main__":
    main()
