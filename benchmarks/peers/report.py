"""The tables of ``benchmarks/peers``: training and decoding rows, ours against fairseq's."""

from __future__ import annotations

import platform
from typing import Any

FAIRSEQ_2P = "fairseq (2 processes)"
FAIRSEQ = ("fairseq", FAIRSEQ_2P)
"""fairseq's rows: each layout it trains in on a CPU."""
OURS = ("ours (Ray Train, as tfm run)", "ours (one process)")
"""Our rows: the layout ``tfm run`` trains in, and one plain process."""


def best_of(train: dict[str, Any], rows: tuple[str, ...]) -> str | None:
    """The row of ``rows`` with the most target tokens a second (None: none trained)."""
    rates = {
        r: train[r]["target_tokens_per_s"]
        for r in rows
        if "target_tokens_per_s" in train.get(r, {})
    }
    return max(rates, key=rates.__getitem__) if rates else None


def best(train: dict[str, Any], rows: tuple[str, ...]) -> float | None:
    """The target tokens a second of ``best_of``'s row."""
    row = best_of(train, rows)
    return train[row]["target_tokens_per_s"] if row else None


def tables(results: dict[str, Any]) -> str:
    """The markdown tables of a run's results: every layout measured, then best against best."""
    train, decode = results["train"], results["decode"]
    reference = best(train, FAIRSEQ)
    lines = [
        "| training | layout | target tokens/s | vs fairseq's best | target tokens an update "
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
    rows = results.get("best_layouts", {})
    lines += [
        "",
        f"train tokens/s ours/fairseq (best layouts): {ratio:.2f} "
        f"({rows.get('ours')} / {rows.get('fairseq')})"
        if ratio
        else "train tokens/s ours/fairseq (best layouts): n/a",
    ]
    return "\n".join(lines) + "\n"


LAYOUTS = {
    "fairseq": "fairseq-train, 1 process x 2 threads, 2 x 4,096 accumulated",
    FAIRSEQ_2P: "fairseq-train, 2 processes x 1 thread (its data parallelism, gloo), 4,096 each",
    # eole 0.6 trains on a CPU in one process (its multi-process mode is one process a GPU)
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
