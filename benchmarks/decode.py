"""Decoding speed: the incremental key/value cache against recomputing the whole prefix.

1. Greedy decoding of fixed 50-token outputs, with and without the cache (speed ratio).
2. Beam search (batch 32, beam 4, ~25-token sources as in newstest) with and without the cache,
   in target tokens per second, for the debug and base sizes.

Random weights are fine for speed; EOS is masked so every output has the same fixed length.

3. With ``--bf16``: the same beam search with the model's weights in bfloat16 (``decode.dtype:
   bfloat16``), against float32 with the cache in the same run, and how many outputs agree.

    python benchmarks/decode.py --quick [--threads 2] [--json out.json]
    python benchmarks/decode.py --sizes base --threads 2 --bf16 [--cache-only]   # 50-token outputs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
from common import best_tokens, report, vocab_for  # noqa: E402

from transformer_core import EOS_ID, PAD_ID, Transformer, decoding, presets  # noqa: E402


def no_eos(decode):
    """A decoder entry point with EOS masked out, so outputs run to the requested fixed length."""

    def masked(*args):
        logits = decode(*args)
        logits[..., EOS_ID] = float("-inf")
        return logits

    return masked


class NoEOS(Transformer):
    """The model, with EOS masked out of every search step by the ``decode_step`` below."""


# Every search step goes through decoding.decode_step, cached or not (decoding.RecomputeState),
# and search looks it up on the module.
decoding.decode_step = no_eos(decoding.decode_step)


GREEDY = {"greedy": True, "beam_size": 1}
"""The settings of the greedy loop (dev BLEU's search)."""


def sources(batch: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Random sources of ``length`` +/- 5 tokens, right-padded, ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length - 5), length + 6, (batch,), generator=g)
    src = torch.full((batch, int(lengths.max()) + 1), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS_ID
    return src


def timed(search, *args, **kwargs) -> tuple[float, list[list[int]]]:
    """Seconds taken by ``search(*args, **kwargs)``, and its outputs."""
    start = time.perf_counter()
    out = search(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer sentences, shorter beam outputs"
    )
    parser.add_argument("--sizes", default="debug,base", help="comma-separated presets")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--cache-only",
        action="store_true",
        help="skip the (slow) runs without the cache; their columns are left empty",
    )
    parser.add_argument(
        "--bf16", action="store_true", help="also beam search with bfloat16 weights"
    )
    return parser.parse_args()


def with_and_without_cache(
    model: Transformer, src: torch.Tensor, cache_only: bool, **search
) -> tuple[float, float | None, list[list[int]], list[list[int]] | None]:
    """Seconds and outputs of ``search`` with the cache, then without it (None with
    ``cache_only``)."""
    t_cache, out_cache = timed(best_tokens, model, src, **search)
    if cache_only:
        return t_cache, None, out_cache, None
    t_full, out_full = timed(best_tokens, model, src, **search, use_cache=False)
    return t_cache, t_full, out_cache, out_full


def measure_size(size: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Greedy and beam search of one preset, with and without the cache; beam in bfloat16 too
    with ``--bf16``."""
    greedy_batch, greedy_len = (16, 50) if args.quick else (32, 50)
    beam_batch, beam_k, beam_len = (32, 4, 12) if args.quick else (32, 4, 50)
    torch.manual_seed(0)
    vocab = vocab_for(size)
    model = NoEOS(presets.get(size), vocab).to(device).eval()
    best_tokens(model, sources(1, 25, vocab).to(device), **GREEDY, max_len=2)  # warm-up

    src = sources(greedy_batch, 25, vocab).to(device)
    timings = with_and_without_cache(model, src, args.cache_only, **GREEDY, max_len=greedy_len)
    rows = [row(size, vocab, "greedy", greedy_batch, 1, greedy_len, *timings)]

    src = sources(beam_batch, 25, vocab, seed=1).to(device)
    timings = with_and_without_cache(
        model, src, args.cache_only, beam_size=beam_k, max_len=beam_len
    )
    t_cache, _, out_cache, _ = timings
    rows.append(row(size, vocab, "beam", beam_batch, beam_k, beam_len, *timings))

    if args.bf16:
        model = model.to(torch.bfloat16)
        best_tokens(model, sources(1, 25, vocab).to(device), beam_size=beam_k, max_len=2)
        t_bf16, out_bf16 = timed(best_tokens, model, src, beam_size=beam_k, max_len=beam_len)
        bf16 = row(size, vocab, "beam", beam_batch, beam_k, beam_len, t_bf16, None, out_bf16, None)
        bf16["dtype"] = "bfloat16"
        bf16["vs_fp32_cache"] = t_cache / t_bf16
        bf16["same_as_fp32"] = sum(a == b for a, b in zip(out_bf16, out_cache, strict=True)) / len(
            out_cache
        )
        rows.append(bf16)
    return rows


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for size in args.sizes.split(","):
        rows += measure_size(size, args, device)
    report(
        f"Decoding speed on {device.type}, ~25-token sources, fixed-length outputs", rows, args.json
    )
    if device.type == "cpu" and args.sizes == "base" and args.cache_only and not args.quick:
        record_row(rows)


def record_row(rows: list[dict]) -> None:
    """docs/benchmarks.md's CPU decoding row: base's beam search in float32 and bfloat16."""
    beams = {r["dtype"]: r for r in rows if r["search"] == "beam"}
    if "bfloat16" in beams:
        figures.record(
            "decode",
            "decoding-cpu",
            f"{beams['float32']['cache_tok/s']:,.0f} / **{beams['bfloat16']['cache_tok/s']:,.0f}** "
            "target tokens/s",
        )


def row(size, vocab, search, batch, beam, out_len, t_cache, t_full, out_cache, out_full) -> dict:
    assert all(len(o) == out_len for o in out_cache), "outputs are not of the fixed length"
    tokens = batch * out_len  # target tokens returned
    return {
        "model": size,
        "vocab": vocab,
        "search": search,
        "batch": batch,
        "beam": beam,
        "out_len": out_len,
        "dtype": "float32",
        "cache_tok/s": tokens / t_cache,
        "no_cache_tok/s": None if t_full is None else tokens / t_full,
        "speedup": None if t_full is None else t_full / t_cache,
        "same_output": None if out_full is None else out_cache == out_full,
        "vs_fp32_cache": None,
        "same_as_fp32": None,
    }


if __name__ == "__main__":
    main()
