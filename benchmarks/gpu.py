"""The GPU measurement suite, one command (``make bench-gpu``), one GPU, a few minutes.

1. Training throughput of Transformer base and big, bf16 autocast, torch.compile off and on:
   tokens/s (source + target), target tokens/s, model TFLOP/s and MFU (transformer_core/flops.py
   against the device's datasheet bf16 peak), peak memory. The paper's batch: one 25k-token
   step, lengths from a log-normal with WMT14 En-De BPE's means (~27 source, ~30 target pieces)
   and a long tail, a 37k vocabulary, pad_multiple 8, fused Adam, prefetched pinned batches;
   each speed switch flipped once (train.fused_loss: the projection fused with the loss).
2. The same Trainer loop inside a Ray Train worker (1 GPU) against the plain loop in this
   process, interleaved plain, Ray, plain, Ray, plain (the plain runs' spread is the noise).
3. Where the time goes: torch.profiler over 3 more steps of each run: the share of wall time the
   GPU was busy, which scaled-dot-product-attention kernels ran (with the padding masks), and for
   the largest model GPU time by kernel kind and the top kernels.
4. Beam-search decoding of base (beam 4, batches 64 and 128, 50-token outputs with EOS masked),
   float32 and bfloat16 weights.
5. Time to BLEU: configs/multi30k_en_de_gpu.yaml's model trained for ``--multi30k-minutes`` on
   the shards its pipeline prepared (``--multi30k WORKDIR``), dev BLEU at every validation and
   test2016 BLEU of the last weights (the Trainer driven directly: no Prefect or MLflow needed).
6. With ``--peers-wheels``: fairseq (``--fp16``) and eole (bf16) train the same sizes on the
   same rows beside ours: target tokens/s and MFU (``benchmarks/gpu_peers.py``).

    python benchmarks/gpu.py --preflight          # exit 2 with one line when CUDA is absent
    python benchmarks/gpu.py --out benchmarks/results/gpu [--quick] [--sizes big] \
        [--skip ray,switches,compile,decode] [--multi30k WORKDIR [--multi30k-minutes 3]] \
        [--peers-wheels .whl/peers]

``make bench-gpu BENCH_FLAGS="..."`` passes flags through. A Multi30k workdir comes from
``for s in download clean tokenizer shard; do tfm stage $s --config
configs/multi30k_en_de_gpu.yaml --set workdir=WORKDIR; done`` on any machine.

Writes ``gpu.json`` and ``gpu.md`` (the tables) under ``--out`` and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

try:
    import numpy  # noqa: F401  (the suite needs it: the one line names it when absent)
    import torch
except ImportError as err:  # the preflight's one line where this Python has no torch at all
    print(
        f"bench-gpu: no {err.name} in {sys.executable} (set BENCH_GPU_PYTHON to a Python with a "
        "CUDA build of torch)",
        file=sys.stderr,
    )
    sys.exit(2)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402
from gpu_decoding import decoding  # noqa: E402
from gpu_multi30k import multi30k_bleu  # noqa: E402
from gpu_ray import ray_vs_plain  # noqa: E402
from gpu_training import ROWS, VOCAB, synthetic_corpus, training_run, warm_up_gpu  # noqa: E402

from training.data import TokenData  # noqa: E402

SECTIONS: dict[str, str] = {
    "training": "Training throughput, bf16 autocast, 25k-token steps, one GPU",
    "ray": "Ray Train (1 worker) against the plain loop, same GPU",
    "profile_kinds": "Where the largest model's training step spends its GPU time",
    "profile_top": "Its top kernels",
    "decoding": "Beam search (base, beam 4, 50-token outputs), target tokens/s",
    "multi30k": "Multi30k En-De on one GPU: BLEU after a fixed time",
    "peers": "fairseq (--fp16) and eole (bf16) beside ours, same GPU, 25k-token updates",
}


def markdown(title: str, rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if abs(v) < 1:
            return f"{v:.3f}"
        return f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"
    return "" if v is None else str(v)


class Report:
    """The suite's results, rewritten to ``gpu.json`` and ``gpu.md`` under ``out`` after every
    section (a run cut short keeps what it measured) and printed as each section ends."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.env = {
            "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "command": " ".join(sys.argv),
        }
        self.results: dict[str, Any] = {"environment": self.env}
        self.started = time.time()

    def save(self) -> None:
        env = self.env
        (self.out / "gpu.json").write_text(json.dumps(self.results, indent=2) + "\n")
        text = f"## {env['date']}, {env['device']}, torch {env['torch']} (CUDA {env['cuda']})\n\n"
        text += f"`{env['command']}`\n\n"
        for key, title in SECTIONS.items():
            text += markdown(title, self.results.get(key, [])) + "\n"
        (self.out / "gpu.md").write_text(text)

    def section(self, key: str, rows: list[dict]) -> None:
        self.results.setdefault(key, []).extend(rows)
        self.save()
        print(markdown(SECTIONS[key], rows), flush=True)

    def log(self, what: str) -> None:
        print(f"[{time.time() - self.started:5.0f}s] {what}", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preflight", action="store_true", help="only check that CUDA is here")
    parser.add_argument("--out", default="benchmarks/results/gpu", help="folder for JSON + md")
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--sizes", default="base,big")
    parser.add_argument(
        "--skip", default="", help="comma-separated: train,compile,switches,ray,decode,multi30k"
    )
    parser.add_argument(
        "--multi30k",
        default="",
        help="workdir where `tfm stage shard --config MULTI30K_CONFIG` prepared the shards "
        "(the Multi30k BLEU row is skipped without it)",
    )
    parser.add_argument("--multi30k-config", default="configs/multi30k_en_de_gpu.yaml")
    parser.add_argument("--multi30k-minutes", type=float, default=3.0)
    parser.add_argument(
        "--peers-wheels",
        default="",
        help="folder of `benchmarks/gpu_peers.py wheels`: fairseq and eole train each size too",
    )
    return parser.parse_args()


def training_runs(sizes: list[str], skip: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """Every size with the defaults and with the fused loss; each other switch flipped once, on
    the smaller model; every size compiled, and the largest compiled with the fused loss too."""
    # Each compiled run costs 1-1.5 minutes of compiling: the suite stays under 9 minutes.
    runs = [(size, {"fused_loss": fused}) for size in sizes for fused in (False, True)]
    if "switches" not in skip:
        runs += [(sizes[0], {"cudnn_attention": True}), (sizes[0], {"prefetch": 0})]
        runs += [(sizes[0], {"fused_adam": False}), (sizes[0], {"pad_multiple": 1})]
    if "compile" not in skip:
        runs += [(size, {"compile": ("model",)}) for size in sizes]
        runs += [(sizes[-1], {"compile": ("model",), "fused_loss": True})]
    return runs


def measure_training(
    report: Report, sizes: list[str], steps: int, corpus: TokenData, skip: set[str]
) -> None:
    """The training rows, and the profile of the largest model's plain and compiled runs."""
    for size, switches in training_runs(sizes, skip):
        report.log(f"training {size} {switches}")
        row, kinds, top = training_run(size, steps, corpus, **switches)
        report.section("training", [row])
        if size == sizes[-1] and set(switches) <= {"compile", "fused_loss"}:
            report.section("profile_kinds", kinds)
            report.section("profile_top", top)


def measure_peers(
    report: Report, wheels: Path, sizes: list[str], steps: int, corpus: TokenData
) -> None:
    import gpu_peers

    report.log("peers: fairseq, eole")
    rows = gpu_peers.rows(
        wheels, sizes, corpus, VOCAB, steps, report.out / "peers",
        report.results.get("training", []),
    )  # fmt: skip
    report.section("peers", rows)


def record_rows(results: dict[str, Any]) -> None:
    """The rows of docs/benchmarks.md that a full-length run (no ``--quick``) measured: Ray
    Train against the plain loop, base eager with the default switches, the best compiled
    base and big, and beam search at batch 128 in bfloat16."""
    device = results["environment"]["device"]

    def record(row_id: str, figure: str) -> None:
        figures.record("gpu", row_id, figure, machine=device)

    runs = [r for r in results.get("ray", []) if r["run"] != "mean" and r["loop"] != "plain"]
    if runs:
        ratios = [r["vs_plain_mean"] for r in runs]
        record("ray-train-vs-plain-loop-gpu", f"{min(ratios):.3f}-{max(ratios):.3f}")
    training = results.get("training", [])
    # the first base run is the default switches' (training_runs)
    eager = next((r for r in training if r["model"] == "base" and not r["compile"]), None)
    if eager is not None and not eager["fused_loss"]:
        record("gpu-base-eager", f"{eager['tokens/s']:,.0f} tokens/s, {eager['MFU']:.1%} MFU")
    best = {}
    for r in (r for r in training if r["compile"] and r["MFU"] is not None):
        if r["MFU"] > best.get(r["model"], {"MFU": -1.0})["MFU"]:
            best[r["model"]] = r
    if {"base", "big"} <= set(best):
        base, big = best["base"], best["big"]
        record(
            "gpu-training-mfu",
            f"{base['tokens/s']:,.0f} / {big['tokens/s']:,.0f} tokens/s; "
            f"**{base['MFU']:.1%} / {big['MFU']:.1%} MFU**",
        )
    beam = [
        r
        for r in results.get("decoding", [])
        if (r["dtype"], r["batch"], r["out_len"]) == ("bfloat16", 128, 50)
    ]
    if beam:
        record("gpu-beam-search", f"{beam[0]['tgt_tokens/s']:,.0f} target tokens/s")


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print(
            f"bench-gpu: no CUDA device visible to torch {torch.__version__} "
            "(a CUDA build of torch and an NVIDIA GPU are needed; set GPU_PYTHON to such a Python)",
            file=sys.stderr,
        )
        return 2
    if args.preflight:
        print(f"bench-gpu: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        return 0
    skip = set(filter(None, args.skip.split(",")))  # train, compile, ray, decode
    steps = 5 if args.quick else 15
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    corpus = synthetic_corpus(ROWS)
    sizes = args.sizes.split(",")
    warm_up_gpu()
    if "ray" not in skip:  # first, in a process that has not compiled or profiled anything
        report.log("Ray Train vs plain loop")
        report.section("ray", ray_vs_plain(sizes[0], 3 * steps, corpus))
    if "train" not in skip:
        measure_training(report, sizes, steps, corpus, skip)
    if "multi30k" not in skip and args.multi30k:
        report.log(f"Multi30k, {args.multi30k_minutes} minutes")
        rows = multi30k_bleu(Path(args.multi30k), args.multi30k_config, args.multi30k_minutes)
        report.section("multi30k", rows)
    if args.peers_wheels:
        measure_peers(report, Path(args.peers_wheels), sizes, steps, corpus)
    if "decode" not in skip:
        report.log("decoding")
        report.section("decoding", decoding((64, 128), 20 if args.quick else 50))
    report.log(f"done: {out / 'gpu.md'}, {out / 'gpu.json'}")
    if not args.quick:
        record_rows(report.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
