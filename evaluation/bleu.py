"""BLEU of detokenized translations, measured two ways and never confused.

- ``bleu_sacre``: sacreBLEU on detokenized text (its own 13a tokenization), reported with its
  signature. This is the number to compare across papers and systems today.
- ``bleu_tok_compound``: the paper-comparable "tokenized BLEU" of tensor2tensor's
  ``get_ende_bleu.sh``: Moses ``tokenizer.perl -l <tgt>`` (here sacremoses, unescaped; escaping
  maps tokens one-to-one and cannot change BLEU) on hypothesis and reference, compound hyphens
  split as ``##AT##-##AT##``, then ``multi-bleu.perl`` (here sacreBLEU with ``tokenize='none'``
  and no smoothing, which computes the same corpus BLEU). Not comparable with ``bleu_sacre``.
- ``bleu_tok_lc``: Moses-tokenized, lowercased BLEU (``multi-bleu.perl -lc`` on
  ``tokenizer.perl`` output), the form Multi30k papers report (the dataset's own scripts
  lowercase and tokenize). Comparable with neither of the above.
- ``chrf``: sacreBLEU's chrF2, with its signature.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "METRICS",
    "bleu_by_length",
    "moses_tokenize",
    "plot_bleu_by_length",
    "score_texts",
    "sentence_bleu",
    "split_compounds",
    "write_sentences",
]

METRICS = ("bleu_sacre", "bleu_tok_compound", "bleu_tok_lc", "chrf")
# Source-length buckets (whitespace words) of the BLEU-by-length plot: [lo, hi).
LENGTH_EDGES = (1, 10, 20, 30, 40, 50, 60)

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """Split hyphenated compounds as the paper's BLEU script does: ``a-b`` -> ``a ##AT##-##AT## b``.

    One left-to-right pass, exactly like the reference perl substitution (Python's ``re.sub``
    and perl's ``s///g`` both take non-overlapping matches). ``E-Mail-Adresse`` splits twice,
    but a one-character part between two hyphens is consumed by the first match, so
    ``a-b-c`` -> ``a ##AT##-##AT## b-c``, as in every published number that used the script.
    Repeating the pass "until nothing changes" would depart from the reference and never end:
    the marker ``##AT##-##AT##`` itself matches.
    """
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def moses_tokenize(texts: Sequence[str], lang: str) -> list[str]:
    """Moses tokenization (``tokenizer.perl -l <lang>``, no aggressive hyphen splitting)."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    out = []
    for text in texts:
        tokenized = tokenizer.tokenize(text, escape=False, return_str=True)
        assert isinstance(tokenized, str)  # return_str; sacremoses types it as a list or a str
        out.append(tokenized)
    return out


def score_texts(hyps: Sequence[str], refs: Sequence[str], lang: str) -> dict[str, Any]:
    """Corpus scores of detokenized ``hyps`` against one reference each, in target language
    ``lang``.

    Returns ``bleu_sacre`` (+ ``bleu_sacre_signature``, ``bleu_sacre_details``),
    ``bleu_tok_compound`` (+ signature), ``bleu_tok_lc`` (+ signature), ``chrf`` (+ signature)
    and ``segments``.
    """
    from sacrebleu.metrics import BLEU, CHRF

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ValueError("cannot score an empty test set (0 segments)")
    hyps, refs = list(hyps), list(refs)

    sacre = BLEU(trg_lang=lang)
    sacre_result = sacre.corpus_score(hyps, [refs])
    chrf = CHRF()
    chrf_result = chrf.corpus_score(hyps, [refs])

    moses_hyps, moses_refs = moses_tokenize(hyps, lang), moses_tokenize(refs, lang)
    tok_hyps = [split_compounds(t) for t in moses_hyps]
    tok_refs = [split_compounds(t) for t in moses_refs]
    # multi-bleu.perl has no smoothing: a corpus with no matching 4-gram scores 0.
    tok = BLEU(tokenize="none", force=True, smooth_method="none")
    tok_result = tok.corpus_score(tok_hyps, [tok_refs])
    lc = BLEU(tokenize="none", force=True, smooth_method="none", lowercase=True)
    lc_result = lc.corpus_score(moses_hyps, [moses_refs])

    return {
        "bleu_sacre": sacre_result.score,
        "bleu_sacre_signature": str(sacre.get_signature()),
        "bleu_sacre_details": {
            "precisions": list(sacre_result.precisions),
            "bp": sacre_result.bp,
            "sys_len": sacre_result.sys_len,
            "ref_len": sacre_result.ref_len,
        },
        "bleu_tok_compound": tok_result.score,
        "bleu_tok_compound_signature": (
            f"pretok:moses-{lang}+compound-atat|{tok.get_signature()}"
            f"|sacremoses:{metadata.version('sacremoses')}"
        ),
        "bleu_tok_lc": lc_result.score,
        "bleu_tok_lc_signature": (
            f"pretok:moses-{lang}|{lc.get_signature()}|sacremoses:{metadata.version('sacremoses')}"
        ),
        "chrf": chrf_result.score,
        "chrf_signature": str(chrf.get_signature()),
        "segments": len(hyps),
    }


def sentence_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str) -> list[float]:
    """sacreBLEU per segment (exp smoothing, effective order: defined for short segments)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(trg_lang=lang, effective_order=True)
    return [bleu.sentence_score(h, [r]).score for h, r in zip(hyps, refs, strict=True)]


def bleu_by_length(
    sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str], lang: str
) -> list[dict[str, Any]]:
    """Corpus sacreBLEU per source-length bucket (whitespace words); empty buckets left out."""
    from sacrebleu.metrics import BLEU

    edges = [*LENGTH_EDGES, float("inf")]
    rows = []
    lengths = [len(s.split()) for s in sources]
    for lo, hi in zip([0, *edges[:-1]], edges, strict=True):
        idx = [i for i, n in enumerate(lengths) if lo <= n < hi]
        if not idx:
            continue
        if hi == float("inf"):
            label = f"{lo}+"
        else:
            label = f"{lo}" if hi - lo == 1 else f"{lo}-{int(hi) - 1}"
        score = BLEU(trg_lang=lang).corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]])
        rows.append({"bucket": label, "segments": len(idx), "bleu_sacre": score.score})
    return rows


def plot_bleu_by_length(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Bar chart of ``bleu_by_length`` rows, segment counts on the bars (Agg, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [r["bucket"] for r in rows]
    bars = ax.bar(labels, [r["bleu_sacre"] for r in rows], color="#4C72B0")
    for bar, row in zip(bars, rows, strict=True):
        ax.annotate(
            f"n={row['segments']}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("sacreBLEU")
    ax.set_title(title)
    top = max((r["bleu_sacre"] for r in rows), default=0.0)
    ax.set_ylim(0, max(top * 1.15, 1.0))  # room for the labels
    fig.tight_layout()
    fig.savefig(path, format="png")


def write_sentences(
    path: Path,
    sources: Sequence[str],
    refs: Sequence[str],
    hyps: Sequence[str],
    scores: Sequence[float],
) -> None:
    """TSV with a header: index, source, reference, hypothesis, sentence_bleu (tabs -> spaces)."""

    def clean(text: str) -> str:
        return text.replace("\t", " ")

    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("index\tsource\treference\thypothesis\tsentence_bleu\n")
        for i, (s, r, h, b) in enumerate(zip(sources, refs, hyps, scores, strict=True)):
            f.write(f"{i}\t{clean(s)}\t{clean(r)}\t{clean(h)}\t{b:.2f}\n")


def read_sentences(path: Path) -> tuple[list[str], list[str], list[str]]:
    """``write_sentences``' sources, references and hypotheses (a tab in one was written as a
    space, which no metric here tells from a tab)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
