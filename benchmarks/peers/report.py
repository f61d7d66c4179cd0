"""The tables of ``benchmarks/peers``: training and decoding rows, ours against fairseq's."""

from __future__ import annotations

import platform
from typing import Any


def tables(results: dict[str, Any]) -> str:
    """The markdown tables of a run's results."""
    train, decode = results["train"], results["decode"]
    reference = train.get("fairseq", {}).get("target_tokens_per_s")
    lines = [
        "| training | layout | target tokens/s | vs fairseq | target tokens an update "
        "| timed updates | timed s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in train.items():
        if "problem" in r:
            lines.append(f"| {name} | not run: {r['problem']} | | | | | |")
            continue
        ratio = f"{r['target_tokens_per_s'] / reference:.2f}" if reference else "n/a"
        lines.append(
            f"| {name} | {r['layout']} | {r['target_tokens_per_s']:,.0f} | {ratio} | "
            f"{r['target_tokens_per_update']:,.0f} | {r['timed_updates']} | "
            f"{r['timed_seconds']:.0f} |"
        )
    lines += [
        "",
        "| decoding (test2016, beam 5) | sentences/s | vs fairseq-generate | decode s | command s "
        "| mean output tokens | bleu_tok_lc |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    ref = decode.get("fairseq-generate", {})
    ref_rate = ref["sentences"] / ref["decode_seconds"] if "decode_seconds" in ref else None
    for name, r in decode.items():
        if "problem" in r:
            lines.append(f"| {name} | not run: {r['problem']} | | | | | |")
            continue
        rate = r["sentences"] / r["decode_seconds"]
        ratio = f"{rate / ref_rate:.2f}" if ref_rate else "n/a"
        lines.append(
            f"| {name} | {rate:.1f} | {ratio} | {r['decode_seconds']:.1f} | {r['wall_s']:.0f} | "
            f"{r['mean_output_tokens']:.1f} | {r['bleu_tok_lc']:.2f} |"
        )
    ratio = results.get("ours_over_fairseq")
    lines += [
        "",
        f"train tokens/s ours/fairseq: {ratio:.2f}"
        if ratio
        else "train tokens/s ours/fairseq: n/a",
    ]
    return "\n".join(lines) + "\n"


LAYOUTS = {
    "fairseq": "fairseq-train, 1 process x 2 threads, 2 x 4,096 accumulated",
    "eole": "eole train, 1 process x 2 threads, 2 x 4,096 accumulated",
    "ours (Ray Train, as tfm run)": "Ray Train, 2 workers x 1 thread, 4,096 each",
    "ours (one process)": "Trainer, 1 process x 2 threads, 2 x 4,096 accumulated",
}


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
