"""Two systems on the same references, set by set: each one's figure, the difference, its 95%
interval and its p-value by paired bootstrap resampling (sacreBLEU's ``PairedTest``).

The figures are ``evaluation.bleu``'s (``bleu_sacre``, ``bleu_tok_compound``, ``chrf``), computed
exactly as the score stage does. The p-value is sacreBLEU's paired bootstrap test (after Koehn
2004 and Moses' ``bootstrap-hypothesis-difference-significance.pl``): how often a resampled test
set shows a difference at least as large as the real one if the systems were equally good. The
interval is of the difference ``a - b`` over the same resamples (the same indices, drawn from
sacreBLEU's seed, ``SACREBLEU_SEED``, 12345 unless set), so a rerun prints the same figures.
Written here because sacreBLEU reports each system's own interval, not the difference's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["COMPARED", "MetricComparison", "compare_systems", "plot_differences"]

COMPARED = ("bleu_sacre", "bleu_tok_compound", "chrf")
"""The metrics two systems are compared on, in the order a table shows them."""
RESAMPLES = 1_000
"""Paired bootstrap resamples: sacreBLEU's default."""


@dataclass(frozen=True)
class MetricComparison:
    """System ``a`` against system ``b`` on one metric of one test set."""

    metric: str
    a: float
    """System a's corpus figure (as the score stage computes it)."""
    b: float
    difference: float
    """``a - b``: above 0 when a scores higher."""
    low: float
    """The 95% interval of the difference over the paired resamples: its lower bound ..."""
    high: float
    """... and its upper bound."""
    p_value: float
    """sacreBLEU's paired bootstrap p-value (1.0 for identical outputs: nothing to test)."""
    signature: str
    """The metric's sacreBLEU signature with the test's (``bs:1000``, ``seed:12345``)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _metrics(lang: str) -> dict[str, tuple[Any, Callable[[Sequence[str]], list[str]]]]:
    """Each compared metric as a fresh sacreBLEU metric and the text preparation it scores
    (``evaluation.bleu.score_texts``'s, so the figures are the score stage's)."""
    from sacrebleu.metrics import BLEU, CHRF

    from evaluation.bleu import moses_tokenize, split_compounds

    def plain(texts: Sequence[str]) -> list[str]:
        return list(texts)

    def compound(texts: Sequence[str]) -> list[str]:
        return [split_compounds(t) for t in moses_tokenize(texts, lang)]

    return {
        "bleu_sacre": (BLEU(trg_lang=lang), plain),
        # multi-bleu.perl has no smoothing, as in score_texts.
        "bleu_tok_compound": (BLEU(tokenize="none", force=True, smooth_method="none"), compound),
        "chrf": (CHRF(), plain),
        # Not in COMPARED's table; what a lowercasing recipe's register.metric compares.
        "bleu_tok_lc": (
            BLEU(tokenize="none", force=True, smooth_method="none", lowercase=True),
            lambda texts: moses_tokenize(texts, lang),
        ),
    }


def compare_systems(
    refs: Sequence[str],
    hyps_a: Sequence[str],
    hyps_b: Sequence[str],
    lang: str,
    metrics: Sequence[str] = COMPARED,
    resamples: int = RESAMPLES,
) -> list[MetricComparison]:
    """System a against system b (the baseline) on one reference each, in target language
    ``lang``: one ``MetricComparison`` per metric. Inputs of different lengths, or none, are
    refused."""
    if not len(refs) == len(hyps_a) == len(hyps_b):
        raise ValueError(
            f"{len(refs)} references, {len(hyps_a)} and {len(hyps_b)} hypotheses: every "
            "reference needs exactly one hypothesis of each system"
        )
    if not refs:
        raise ValueError("cannot compare on an empty test set (0 segments)")
    known = _metrics(lang)
    unknown = [m for m in metrics if m not in known]
    if unknown:
        raise ValueError(f"cannot compare on {unknown}: known metrics are {list(known)}")
    identical = list(hyps_a) == list(hyps_b)
    out = []
    for name in metrics:
        metric, prepare = known[name]
        out.append(
            _compare_one(
                name, metric, prepare(refs), prepare(hyps_a), prepare(hyps_b), resamples, identical
            )
        )
    return out


def _compare_one(
    name: str,
    metric: Any,  # Any: sacreBLEU's Metric, whose statistics methods it does not type
    refs: list[str],
    hyps_a: list[str],
    hyps_b: list[str],
    resamples: int,
    identical: bool,
) -> MetricComparison:
    import numpy as np
    from sacrebleu.significance import PairedTest, Result

    paired = PairedTest(
        [("b", hyps_b), ("a", hyps_a)],
        {name: metric},
        references=[refs],
        test_type="bs",
        n_samples=resamples,
    )
    signatures, results = paired()
    (key,) = signatures  # the metric's own name (BLEU, chrF2)
    baseline, system = results[key]
    assert isinstance(baseline, Result) and isinstance(system, Result)
    assert system.p_value is not None  # the tested system (not the baseline) always has one
    # The indices sacreBLEU's paired bootstrap draws (_paired_bs_test), for the difference's
    # interval over the same resamples.
    seed = paired._seed or None
    idxs = np.random.default_rng(seed).choice(len(refs), size=(resamples, len(refs)))
    stats_a = np.array(metric._extract_corpus_statistics(hyps_a, [refs]), dtype="float32")
    stats_b = np.array(metric._extract_corpus_statistics(hyps_b, [refs]), dtype="float32")
    diffs = np.array(
        [
            metric._compute_score_from_stats(stats_a[rows].sum(0)).score
            - metric._compute_score_from_stats(stats_b[rows].sum(0)).score
            for rows in idxs
        ]
    )
    ordered = np.sort(diffs)
    cut = resamples // 40  # 2.5% at each end, as sacreBLEU's estimate_ci cuts
    # sacreBLEU (after MultEval) counts only resamples beyond the real difference, so identical
    # outputs would get its smallest p; there is nothing to test.
    p_value = 1.0 if identical else float(system.p_value)
    return MetricComparison(
        metric=name,
        a=float(system.score),
        b=float(baseline.score),
        difference=float(system.score - baseline.score),
        low=float(ordered[cut]),
        high=float(ordered[resamples - cut - 1]),
        p_value=p_value,
        signature=str(signatures[key]),
    )


def plot_differences(
    rows: Mapping[str, Sequence[MetricComparison]], path: Path, title: str
) -> None:
    """Each set's difference (a - b) with its 95% interval, one panel per metric, a line at 0
    (Agg, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(rows)
    metrics = [c.metric for c in next(iter(rows.values()), [])]
    fig = Figure(figsize=(4 * max(len(metrics), 1), 1.2 + 0.5 * len(names)), dpi=100)
    FigureCanvasAgg(fig)
    for k, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), k + 1)
        found = [next(c for c in rows[name] if c.metric == metric) for name in names]
        ys = list(range(len(names)))
        xs = [c.difference for c in found]
        errors = [[c.difference - c.low for c in found], [c.high - c.difference for c in found]]
        ax.errorbar(xs, ys, xerr=errors, fmt="o", color="#4C72B0", capsize=4)
        for x, y, c in zip(xs, ys, found, strict=True):
            ax.annotate(
                f"p={c.p_value:.3f}",
                (x, y),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        ax.axvline(0, color="grey", linewidth=1)
        ax.set_yticks(ys, names if k == 0 else [""] * len(names))
        ax.set_ylim(len(names) - 0.3, -0.7)  # the first set on top, as in the table
        ax.set_xlabel(f"{metric} difference")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
