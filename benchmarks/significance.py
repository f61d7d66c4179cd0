"""How far apart finished runs' test figures are: ``bleu_tok_lc`` with its spread and a paired test.

Two runs 0.1 BLEU apart on 1,000 sentences may differ by nothing but chance. For each run's work
dir (the translate stage's ``hyp.<tgt>`` and the download stage's ``test.<tgt>``) this prints
the score stage's ``bleu_tok_lc`` (Moses-tokenized, lowercased, no smoothing:
``evaluation.bleu``), its bootstrap mean and 95% interval, the length ratio, and the p-value of
sacreBLEU's paired test against the first run (approximate randomisation by default,
``--test bs`` for paired bootstrap). sacreBLEU seeds its resampling (``SACREBLEU_SEED``, 12345),
so a rerun prints the same figures.

    python benchmarks/significance.py runs/base [runs/other runs/third ...] \\
        [--test ar|bs] [--trials N] [--bootstrap 1000] [--reference 41.02] [--json out.json]

The runs must have translated the same references (checked line by line). One run alone gets
its figure and interval (where the runs to compare it with are gone, say). Two or more runs
(seeds of one config, say) also get their mean and standard deviation, and with ``--reference``
how many standard deviations a published figure lies from that mean.
Hand-written because it is two sacreBLEU calls (``PairedTest``) over the score stage's inputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402


def run_texts(workdir: Path) -> tuple[str, list[str], list[str]]:
    """A finished run's (target language, hypotheses, references) from its work dir."""
    from corpora.text import read_lines

    hyp_files = sorted((workdir / "translate").glob("hyp.*"))
    if len(hyp_files) != 1:
        raise SystemExit(
            f"significance: {workdir / 'translate'} holds {len(hyp_files)} hyp.<lang> files, "
            "not one (is the run's translate stage finished?)"
        )
    lang = hyp_files[0].suffix.lstrip(".")
    ref_file = workdir / "download" / f"test.{lang}"
    if not ref_file.exists():
        raise SystemExit(f"significance: {ref_file} does not exist (is this a run's work dir?)")
    hyps, refs = read_lines(hyp_files[0]), read_lines(ref_file)
    if len(hyps) != len(refs):
        raise SystemExit(
            f"significance: {hyp_files[0]} has {len(hyps)} lines but {ref_file} has {len(refs)}"
        )
    return lang, hyps, refs


def compare(
    workdirs: list[Path], *, test: str = "ar", trials: int = 0, bootstrap: int = 1_000
) -> list[dict]:
    """One row per run: ``bleu_tok_lc``, bootstrap mean and 95% half-width, length ratio, the
    lines identical to the first run's, and the paired test's p-value against the first run.
    ``trials`` 0 takes sacreBLEU's defaults (10,000 randomisation trials, 1,000 paired
    resamples); ``bootstrap`` sizes the intervals of the randomisation test (the paired
    bootstrap's come from its own resamples)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from evaluation.bleu import moses_tokenize

    if not workdirs:
        raise SystemExit("significance: give one or more run work dirs (the first is the baseline)")
    texts = [run_texts(workdir) for workdir in workdirs]
    lang, _, base_refs = texts[0]
    systems = []
    for workdir, (run_lang, hyps, refs) in zip(workdirs, texts, strict=True):
        if (run_lang, refs) != (lang, base_refs):
            raise SystemExit(
                f"significance: {workdir / 'download'} holds other references than "
                f"{workdirs[0] / 'download'}; the runs must share a test set"
            )
        systems.append((str(workdir), moses_tokenize(hyps, lang)))
    refs = moses_tokenize(base_refs, lang)
    # bleu_tok_lc exactly as the score stage computes it (evaluation.bleu.score_texts).
    bleu = BLEU(tokenize="none", force=True, smooth_method="none", lowercase=True)
    paired = PairedTest(
        systems,
        {"BLEU": bleu},
        references=[refs],
        test_type=test,
        n_samples=trials,
        n_ar_confidence=bootstrap,
    )
    _, results = paired()
    rows = []
    base_hyps = systems[0][1]
    for (name, hyps), result in zip(systems, results["BLEU"], strict=True):
        score = bleu.corpus_score(hyps, [refs])
        same = sum(a == b for a, b in zip(hyps, base_hyps, strict=True))
        p_value = result.p_value
        if p_value is not None and same == len(hyps):
            # sacreBLEU (after MultEval) counts only shuffles that differ by more than the real
            # difference, so identical outputs would get its smallest p; there is nothing to test.
            p_value = 1.0
        rows.append(
            {
                "run": name,
                "bleu_tok_lc": round(result.score, 2),
                "bootstrap_mean": None if result.mean is None else round(float(result.mean), 2),
                "ci95_half": None if result.ci is None else round(float(result.ci), 2),
                "length_ratio": round(score.sys_len / score.ref_len, 3),
                "lines_as_first": same,
                f"p_{test}_vs_first": None if p_value is None else round(p_value, 4),
            }
        )
    return rows


def spread(scores: list[float], reference: float | None = None) -> str:
    """One line: the mean and sample standard deviation of two or more runs' ``bleu_tok_lc``
    and, with ``reference``, how many of those standard deviations it lies from the mean."""
    if len(scores) < 2:
        raise ValueError(f"a spread needs two or more runs, got {len(scores)}")
    mean, sd = statistics.mean(scores), statistics.stdev(scores)
    line = f"bleu_tok_lc over {len(scores)} runs: mean {mean:.2f}, standard deviation {sd:.2f}"
    if reference is not None:
        if sd == 0:
            return f"{line}; the reference {reference:g} is {reference - mean:+.2f} from it"
        side = "above" if reference >= mean else "below"
        line += f"; the reference {reference:g} is {abs(reference - mean) / sd:.2f} of them {side}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+", type=Path, help="finished runs' work dirs")
    parser.add_argument("--test", default="ar", choices=["ar", "bs"])
    parser.add_argument(
        "--trials",
        type=int,
        default=0,
        help="randomisation trials or paired resamples; default sacreBLEU's (10,000 / 1,000)",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1_000,
        help="with --test ar: resamples for each run's 95%% interval",
    )
    parser.add_argument(
        "--reference",
        type=float,
        default=None,
        help="a published figure to place against two or more runs' mean and spread",
    )
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = compare(args.workdirs, test=args.test, trials=args.trials, bootstrap=args.bootstrap)
    report(f"Test bleu_tok_lc, paired {args.test} against {args.workdirs[0]}", rows, args.json)
    if len(rows) >= 2:
        print(spread([row["bleu_tok_lc"] for row in rows], args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
