"""Serving speed: our torch beam search against CTranslate2, same weights, same sentences.

One model (random weights: speed does not depend on them) is decoded by each engine in turn,
pass after pass (interleaved, so a slow spell on the machine hits every engine alike); the table
gives each engine's median target tokens per second and its ratio to torch float32 measured in
the same run. Outputs have a fixed length: EOS is masked out of our search (as in
``benchmarks/decode.py``) and CTranslate2 gets min_decoding_length = max_decoding_length.

Engines: ``torch-float32``, ``torch-bfloat16`` (``decode.dtype``), ``ct2-float32`` and
``ct2-int8`` (``decode.engine: ctranslate2`` with that ``decode.compute_type``; the export is
float32 and CTranslate2 quantizes it as it loads).

    python benchmarks/engines.py --quick                  # base, batch 16, 12-token outputs
    python benchmarks/engines.py --threads 2 [--json out.json]   # base, batch 32, 50 tokens
    python benchmarks/engines.py --config configs/multi30k_en_de_tiny.yaml   # a config's model
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from serving import ct2, ct2_export
from tasks.framework.config import load_config
from transformer_core import EOS_ID, PAD_ID, Transformer, decoding, presets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_tokens, report, vocab_for  # noqa: E402

ENGINES = ("torch-float32", "torch-bfloat16", "ct2-float32", "ct2-int8")


def mask_eos() -> None:
    """EOS out of our incremental decoder step, so every output runs to the fixed length."""
    step = decoding.decode_step

    def no_eos(*args):
        logits = step(*args)
        logits[..., EOS_ID] = float("-inf")
        return logits

    decoding.decode_step = no_eos  # search looks it up on the module at each step


def sources(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random sources of ``length`` +/- 5 tokens, each ending in EOS (newstest is ~25)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length - 5), length + 6, (batch,), generator=g).tolist()
    return [torch.randint(4, vocab, (n,), generator=g).tolist() + [EOS_ID] for n in lengths]


def torch_runner(model: Transformer, src_ids: list[list[int]], beam: int, out_len: int):
    """A call decoding ``src_ids`` with our beam search; returns the outputs."""
    src = torch.full((len(src_ids), max(map(len, src_ids))), PAD_ID)
    for i, seq in enumerate(src_ids):
        src[i, : len(seq)] = torch.tensor(seq)
    return lambda: best_tokens(model, src, beam_size=beam, max_len=out_len)


def ct2_runner(engine: ct2.CTranslate2Engine, src_ids: list[list[int]], beam: int, out_len: int):
    """A call decoding ``src_ids`` through the CTranslate2 engine; returns the outputs."""

    def run():
        found = engine.hypotheses(src_ids, beam, 0.6, max_len=out_len, min_len=out_len)
        return [hyps[0].tokens for hyps in found]

    return run


def build(names: list[str], model: Transformer, export: Path, threads: int, src, beam, out_len):
    """One decoding call per engine name, all on the same weights and sources."""
    runners = {}
    for name in names:
        kind, precision = name.split("-")
        if kind == "torch":
            copy = model if precision == "float32" else _cast(model, precision)
            runners[name] = torch_runner(copy, src, beam, out_len)
        else:
            engine = ct2.CTranslate2Engine(export, compute_type=precision, threads=threads)
            runners[name] = ct2_runner(engine, src, beam, out_len)
    return runners


def _cast(model: Transformer, dtype: str) -> Transformer:
    copy = Transformer(model.config, model.src_vocab_size).eval()
    copy.load_state_dict(model.state_dict())
    return copy.to(getattr(torch, dtype))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="batch 16, 12 tokens, 3 passes")
    parser.add_argument("--size", default="base", help="model preset")
    parser.add_argument(
        "--config",
        default=None,
        help="a run config: its model and tokenizer.vocab_size (instead of --size)",
    )
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads")
    parser.add_argument("--batch", type=int, default=None, help="sentences (default 32; 16)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--out-len", type=int, default=None, help="output tokens (50; 12)")
    parser.add_argument("--passes", type=int, default=None, help="timed passes (5; 3)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    size = args.size
    batch = args.batch or (16 if args.quick else 32)
    out_len = args.out_len or (12 if args.quick else 50)
    passes = args.passes or (3 if args.quick else 5)
    names = [n for n in args.engines.split(",") if n]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")
    torch.set_num_threads(args.threads)
    mask_eos()

    torch.manual_seed(0)
    if args.config:
        run = load_config(args.config)
        size, config, vocab = Path(args.config).stem, run.model, run.tokenizer.vocab_size
    else:
        config, vocab = presets.get(size), vocab_for(size)
    model = Transformer(config, vocab).eval()
    src = sources(batch, 25, vocab)
    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(4, vocab)]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        export = ct2_export.save_model(model, pieces, Path(tmp) / "ct2", "float32")
        export_s = time.perf_counter() - started
        runners = build(names, model, export, args.threads, src, args.beam, out_len)
        seconds = measure(runners, passes)
    reference = seconds.get("torch-float32")
    rows = [
        row(name, size, vocab, batch, args.beam, out_len, times, reference)
        for name, times in seconds.items()
    ]
    title = (
        f"Serving engines on cpu: {size} (random weights), batch {batch}, beam {args.beam}, "
        f"~25-token sources, {out_len}-token outputs, {args.threads} threads, median of "
        f"{passes} interleaved passes (export {export_s:.1f} s)"
    )
    report(title, rows, args.json)


def measure(runners: dict, passes: int) -> dict[str, list[float]]:
    """Seconds per pass per engine: a warm-up call each, then ``passes`` rounds in turn."""
    lengths = {}
    for name, run in runners.items():
        lengths[name] = {len(out) for out in run()}  # warm-up, and a check of the fixed length
    if len({frozenset(v) for v in lengths.values()}) != 1:
        raise RuntimeError(f"output lengths differ between engines: {lengths}")
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(passes):
        for name, run in runners.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def row(name, size, vocab, batch, beam, out_len, times, reference) -> dict:
    tokens = batch * out_len  # target tokens returned per pass
    median = statistics.median(times)
    return {
        "engine": name,
        "model": size,
        "vocab": vocab,
        "batch": batch,
        "beam": beam,
        "out_len": out_len,
        "median_s": median,
        "tok/s": tokens / median,
        "vs_torch_fp32": None if reference is None else statistics.median(reference) / median,
    }


if __name__ == "__main__":
    main()
