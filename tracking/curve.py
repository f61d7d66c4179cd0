"""A training run's learning curve, drawn from its journal (the server need not answer)."""

from __future__ import annotations

from pathlib import Path

from tracking.journal import Journal

CURVES = ("loss", "val_loss", "val_bleu")
"""The metrics a learning curve shows."""


def learning_curve(journal: Journal, path: Path) -> Path | None:
    """Train and validation loss, and dev BLEU when measured (right axis), against step (left
    panel) and wall-clock minutes since the run's first metric (right panel), from the run's
    journal (the server need not answer); matplotlib, Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = journal.history(CURVES)
    if not ("loss" in series or "val_loss" in series):
        return None
    t0 = min(t for points in series.values() for _, t, _ in points)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, x_label, x_of in (
        (axes[0], "step", lambda p: p[0]),
        (axes[1], "wall-clock minutes", lambda p: (p[1] - t0) / 60_000),
    ):
        lines = []
        for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
            if key in series:
                ms = series[key]
                marker = "." if len(ms) < 50 else None
                lines += ax.plot(
                    [x_of(p) for p in ms], [p[2] for p in ms], label=label, marker=marker
                )
        ax.set_xlabel(x_label)
        ax.set_ylabel("label-smoothed loss per token")
        ax.grid(alpha=0.3)
        if "val_bleu" in series:
            bleu_ax = ax.twinx()
            ms = series["val_bleu"]
            lines += bleu_ax.plot(
                [x_of(p) for p in ms], [p[2] for p in ms], "g.-", label="dev BLEU (greedy)"
            )
            bleu_ax.set_ylabel("sacreBLEU")
        ax.legend(lines, [line.get_label() for line in lines], loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
