"""The tables of ``benchmarks/peers``: training and decoding rows, ours against fairseq's."""

from __future__ import annotations

import platform
from typing import Any

FAIRSEQ_2P = "fairseq (2 processes)"
FAIRSEQ = ("fairseq", FAIRSEQ_2P)
"""fairseq's rows: each layout it trains in on a CPU."""
OURS = ("ours (Ray Train, as tfm run)", "ours (one process)")
"""Our rows: the layout ``tfm run`` trains in, and one plain process."""
GENERATE = "fairseq-generate"
"""fairseq's decoding row: fairseq-generate on the one-process fairseq training's checkpoint."""
SAME_WEIGHTS = {
    "tfm translate, engine torch, fairseq's weights": "torch",
    "tfm translate, engine ctranslate2, fairseq's weights": "ctranslate2",
}
"""Our decoding rows on ``GENERATE``'s checkpoint (imported), and the engine of each."""


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
        if r.get("reused"):
            lines.append(f"| {name} | not trained in this run: {r['checkpoint']} | | | | | |")
            continue
        ratio = f"{r['target_tokens_per_s'] / reference:.2f}" if reference else "n/a"
        lines.append(
            f"| {name} | {r['layout']} | {r['target_tokens_per_s']:,.0f} | {ratio} | "
            f"{r['target_tokens_per_update']:,.0f} | {r['timed_updates']} | "
            f"{r['timed_seconds']:.0f} |"
        )
    lines += ["", *decode_table(decode)]
    ratio = results.get("ours_over_fairseq")
    rows = results.get("best_layouts", {})
    lines += [
        "",
        f"train tokens/s ours/fairseq (best layouts): {ratio:.2f} "
        f"({rows.get('ours')} / {rows.get('fairseq')})"
        if ratio
        else "train tokens/s ours/fairseq (best layouts): n/a",
        same_weights_line(decode),
    ]
    return "\n".join(lines) + "\n"


def rate(row: dict[str, Any]) -> float | None:
    """A decoding row's sentences a second (None: it did not run)."""
    return row["sentences"] / row["decode_seconds"] if "decode_seconds" in row else None


def decode_table(decode: dict[str, Any]) -> list[str]:
    """The decoding rows: each toolkit's generator on its own model, then ours on fairseq's."""
    lines = [
        "| decoding (test2016, beam 5) | sentences/s | vs fairseq-generate | decode s | command s "
        "| mean output tokens | bleu_tok_lc | identical to fairseq-generate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ref_rate = rate(decode.get(GENERATE, {}))
    for name, r in decode.items():
        if "problem" in r:
            lines.append(f"| {name} | not run: {r['problem']} | | | | | | |")
            continue
        ratio = f"{rate(r) / ref_rate:.2f}" if ref_rate else "n/a"
        same = r.get("identical")
        lines.append(
            f"| {name} | {rate(r):.1f} | {ratio} | {r['decode_seconds']:.1f} | {r['wall_s']:.0f} | "
            f"{r['mean_output_tokens']:.1f} | {r['bleu_tok_lc']:.2f} | "
            + (f"{same:.1%} |" if same is not None else "|")
        )
    return lines


def same_weights_line(decode: dict[str, Any]) -> str:
    """The torch translator against fairseq-generate on fairseq's weights: the rate's ratio,
    the share of identical hypotheses and both BLEUs."""
    head = "decode sentences/s ours/fairseq-generate (same weights)"
    ours, theirs = decode.get(next(iter(SAME_WEIGHTS)), {}), decode.get(GENERATE, {})
    if rate(ours) is None or rate(theirs) is None or ours.get("identical") is None:
        return f"{head}: n/a"
    return (
        f"{head}: {rate(ours) / rate(theirs):.2f} (identical hypotheses: {ours['identical']:.1%}, "
        f"BLEU ours {ours['bleu_tok_lc']:.2f} / fairseq {theirs['bleu_tok_lc']:.2f})"
    )


LAYOUTS = {
    # fairseq and eole in float32, as a user runs them on a CPU (neither was tried in bf16);
    # ours with the recipe's CPU switches: bf16 matmuls where the CPU has native bf16, the
    # fused loss compiled (docs/training.md, "On CPUs")
    "fairseq": "fairseq-train, 1 process x 2 threads, 2 x 4,096 accumulated",
    FAIRSEQ_2P: "fairseq-train, 2 processes x 1 thread (its data parallelism, gloo), 4,096 each",
    # eole 0.6 trains on a CPU in one process (its multi-process mode is one process a GPU)
    "eole": "eole train, 1 process x 2 threads, 2 x 4,096 accumulated",
    "ours (Ray Train, as tfm run)": "Ray Train, 2 workers x 1 thread, 4,096 each; the recipe's "
    "precision: bf16 and compiled fused loss",
    "ours (one process)": "Trainer, 1 process x 2 threads, 2 x 4,096 accumulated; the same",
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
