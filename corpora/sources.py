"""The source registry: where each WMT14 corpus lives and which archive members hold it.

Training corpora are tables here: statmt.org publishes no list of them anyone else keeps. The
dev and test sets (newstest2013, newstest2014 full and filtered) come from sacreBLEU's own
dataset registry (URL, md5, SGM members per direction), the table every BLEU user trusts;
we still download them ourselves, through mirrors, the lock file and safe extraction.

Archive paths are relative to ``https://www.statmt.org/`` (a mirror keeps them); member paths
are exactly as they appear inside the archives. Checksums are ``None`` where nobody publishes
one; the download stage then pins what it saw first in a lock file (see docs/data.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from corpora import CorpusError

STATMT = "https://www.statmt.org/"

Format = Literal["text", "gzip", "sgm", "tsv"]
"""text: one segment per line; gzip: the same, gzipped; sgm: WMT's <seg> files; tsv: one member
with a column per language."""


@dataclass(frozen=True)
class Archive:
    """One downloadable file."""

    path: str
    """Path after https://www.statmt.org/ (a mirror serves the same path)."""
    bytes: int | None = None
    """Expected size, when known."""
    sha256: str | None = None
    """Expected sha256, when published."""
    md5: str | None = None
    """Expected md5, when published (sacrebleu's dataset table has them for the test sets)."""

    @property
    def url(self) -> str:
        """The canonical statmt.org URL (also the key in the lock file)."""
        return STATMT + self.path


@dataclass(frozen=True)
class Corpus:
    """One parallel text: its archive, the member that holds each language, and their format."""

    name: str
    """Corpus name; names the output files (``train/<name>.<lang>``)."""
    archive: str
    """Key of its archive: into ``ARCHIVES``, or a sacreBLEU dataset (``wmt14/full``)."""
    format: Format
    """How the members are written."""
    members: Mapping[str, str]
    """Language -> member path inside the archive (for tsv, every language names the same member)."""
    columns: tuple[str, ...] = ()
    """For tsv: the language of each column."""
    lines: int | None = None
    """Published segment count, when known (a differing count is logged, not fatal)."""


# ----------------------------------------------------------------------------- archives

ARCHIVES: dict[str, Archive] = {
    "europarl-v7": Archive("wmt13/training-parallel-europarl-v7.tgz"),
    "commoncrawl": Archive("wmt13/training-parallel-commoncrawl.tgz"),
    "news-commentary-v9": Archive("wmt14/training-parallel-nc-v9.tgz"),
    "un": Archive("wmt13/training-parallel-un.tgz"),
    "giga-fren": Archive("wmt10/training-giga-fren.tar"),
}
"""The training archives; dev and test archives are sacreBLEU's (``archive``)."""


# ----------------------------------------------------------------------------- training corpora
# Keyed by statmt's pair name (the non-English language first), whatever the run's direction.

TRAIN: dict[str, dict[str, Corpus]] = {
    "de-en": {
        "europarl-v7": Corpus(
            "europarl-v7", "europarl-v7", "text",
            {"de": "training/europarl-v7.de-en.de", "en": "training/europarl-v7.de-en.en"},
        ),
        "commoncrawl": Corpus(
            "commoncrawl", "commoncrawl", "text",
            {"de": "commoncrawl.de-en.de", "en": "commoncrawl.de-en.en"},
        ),
        "news-commentary-v9": Corpus(
            "news-commentary-v9", "news-commentary-v9", "text",
            {"de": "training/news-commentary-v9.de-en.de", "en": "training/news-commentary-v9.de-en.en"},
        ),
    },
    "fr-en": {
        "europarl-v7": Corpus(
            "europarl-v7", "europarl-v7", "text",
            {"fr": "training/europarl-v7.fr-en.fr", "en": "training/europarl-v7.fr-en.en"},
        ),
        "commoncrawl": Corpus(
            "commoncrawl", "commoncrawl", "text",
            {"fr": "commoncrawl.fr-en.fr", "en": "commoncrawl.fr-en.en"},
        ),
        "news-commentary-v9": Corpus(
            "news-commentary-v9", "news-commentary-v9", "text",
            {"fr": "training/news-commentary-v9.fr-en.fr", "en": "training/news-commentary-v9.fr-en.en"},
        ),
        "un": Corpus(
            "un", "un", "text",
            {"fr": "un/undoc.2000.fr-en.fr", "en": "un/undoc.2000.fr-en.en"},
        ),
        "giga-fren": Corpus(
            "giga-fren", "giga-fren", "gzip",
            {"fr": "giga-fren.release2.fixed.fr.gz", "en": "giga-fren.release2.fixed.en.gz"},
        ),
    },
}

DEFAULT_TRAIN: dict[str, tuple[str, ...]] = {
    "de-en": ("europarl-v7", "commoncrawl", "news-commentary-v9"),
    "fr-en": ("europarl-v7", "commoncrawl", "news-commentary-v9", "un", "giga-fren"),
}


# ----------------------------------------------------------------------------- dev and test sets

EVAL_SETS: dict[tuple[str, str], str] = {
    ("newstest2013", "full"): "wmt13",
    ("newstest2014", "full"): "wmt14/full",
    ("newstest2014", "filtered"): "wmt14",
}
"""(name, release) -> the sacreBLEU dataset that holds it."""

PUBLISHED_LINES: dict[tuple[str, str], int] = {
    ("wmt13", "de-en"): 3000,
    ("wmt13", "fr-en"): 3000,
    ("wmt14/full", "de-en"): 3003,
    ("wmt14/full", "fr-en"): 3003,
    ("wmt14", "de-en"): 2737,
}
"""Segments per (sacreBLEU dataset, statmt pair), where published; another count is logged."""


# ----------------------------------------------------------------------------- look-ups


def split_pair(pair: str) -> tuple[str, str]:
    """``"en-de"`` -> ``("en", "de")``; a ValueError unless it names two different languages."""
    src, sep, tgt = pair.partition("-")
    if not sep or not src or not tgt or src == tgt or "-" in tgt:
        raise ValueError(f"language pair {pair!r} must be two different languages as src-tgt, e.g. en-de")
    return src, tgt


def statmt_pair(pair: str) -> str:
    """statmt.org's name for a pair, whichever the direction: en-de and de-en are both ``de-en``."""
    src, tgt = split_pair(pair)
    if "en" not in (src, tgt):
        raise CorpusError(f"WMT14 pairs all include English; {pair!r} does not")
    other = tgt if src == "en" else src
    return f"{other}-en"


def _dataset(key: str):  # sacrebleu.dataset.base.Dataset
    from sacrebleu.dataset import DATASETS

    return DATASETS[key]


def archive(key: str) -> Archive:
    """The archive registered under ``key``: a training archive or a sacreBLEU dataset's."""
    if key in ARCHIVES:
        return ARCHIVES[key]
    if key in EVAL_SETS.values():
        dataset = _dataset(key)
        url = dataset.data[0]
        path = url.split("statmt.org/", 1)[1]
        return Archive(path, md5=dataset.md5[0] if dataset.md5 else None)
    raise CorpusError(f"no archive {key!r} in the registry (known: {', '.join([*ARCHIVES, *EVAL_SETS.values()])})")


def train_corpora(pair: str, names: Sequence[str] = ()) -> list[Corpus]:
    """The named training corpora for ``pair`` (the registry's default set when ``names`` is empty)."""
    key = statmt_pair(pair)
    table = TRAIN.get(key)
    if table is None:
        raise CorpusError(f"no WMT14 training data registered for {pair} (known: {', '.join(TRAIN)})")
    names = tuple(names) or DEFAULT_TRAIN[key]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise CorpusError(f"unknown corpus {unknown[0]!r} for {pair} (known: {', '.join(table)})")
    return [table[n] for n in dict.fromkeys(names)]


def eval_set(name: str, variant: str, pair: str) -> Corpus:
    """A dev or test set release for the direction ``pair``: the source side is sacreBLEU's
    source file of that direction, the target side its reference."""
    key = EVAL_SETS.get((name, variant))
    if key is None:
        known = ", ".join(f"{n} ({v})" for n, v in EVAL_SETS)
        raise CorpusError(f"unknown dev/test set {name!r} ({variant}) (known: {known})")
    langpairs = _dataset(key).langpairs
    if pair not in langpairs:
        known = ", ".join(p for p in langpairs if "en" in p.split("-"))
        raise CorpusError(f"{name} ({variant}) has no {pair} data (known: {known})")
    src, tgt = split_pair(pair)
    source_file, reference_file = langpairs[pair][:2]
    releases = sum(n == name for n, _ in EVAL_SETS)
    return Corpus(
        f"{name}-{variant}" if releases > 1 else name,
        key,
        "sgm",
        {src: source_file, tgt: reference_file},
        lines=PUBLISHED_LINES.get((key, statmt_pair(pair))),
    )
