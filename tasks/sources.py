"""The source registry: where each WMT14 corpus lives and which archive members hold it.

Everything here is data. Archive paths are relative to ``https://www.statmt.org/`` (a mirror keeps
them); member paths are exactly as they appear inside the archives, so a wrong one is a one-line
fix in the tables below. Checksums are ``None`` where statmt.org publishes none; the download
stage then pins what it saw first in a lock file (see docs/data.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tasks.artifacts import StageError

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
    """Key into ``ARCHIVES``."""
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
    "dev": Archive("wmt14/dev.tgz"),
    "test-full": Archive("wmt14/test-full.tgz", md5="a8cd784e006feb32ac6f3d9ec7eb389a"),
    "test-filtered": Archive("wmt14/test-filtered.tgz", md5="84c597844c1542e29c2aff23aaee4310"),
}


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

DEV: dict[str, dict[str, Corpus]] = {
    "newstest2013": {
        "de-en": Corpus(
            "newstest2013", "dev", "text",
            {"de": "dev/newstest2013.de", "en": "dev/newstest2013.en"}, lines=3000,
        ),
        "fr-en": Corpus(
            "newstest2013", "dev", "text",
            {"fr": "dev/newstest2013.fr", "en": "dev/newstest2013.en"}, lines=3000,
        ),
    },
}

# newstest2014 by release, keyed by direction: the source side is the ``src`` file of that
# direction and the target side its ``ref`` file.
TEST: dict[tuple[str, str], dict[str, Corpus]] = {
    ("newstest2014", "full"): {
        "en-de": Corpus(
            "newstest2014-full", "test-full", "sgm",
            {"en": "test-full/newstest2014-deen-src.en.sgm", "de": "test-full/newstest2014-deen-ref.de.sgm"},
            lines=3003,
        ),
        "de-en": Corpus(
            "newstest2014-full", "test-full", "sgm",
            {"de": "test-full/newstest2014-deen-src.de.sgm", "en": "test-full/newstest2014-deen-ref.en.sgm"},
            lines=3003,
        ),
        "en-fr": Corpus(
            "newstest2014-full", "test-full", "sgm",
            {"en": "test-full/newstest2014-fren-src.en.sgm", "fr": "test-full/newstest2014-fren-ref.fr.sgm"},
            lines=3003,
        ),
        "fr-en": Corpus(
            "newstest2014-full", "test-full", "sgm",
            {"fr": "test-full/newstest2014-fren-src.fr.sgm", "en": "test-full/newstest2014-fren-ref.en.sgm"},
            lines=3003,
        ),
    },
    ("newstest2014", "filtered"): {
        "en-de": Corpus(
            "newstest2014-filtered", "test-filtered", "sgm",
            {"en": "test/newstest2014-deen-src.en.sgm", "de": "test/newstest2014-deen-ref.de.sgm"},
            lines=2737,
        ),
        "de-en": Corpus(
            "newstest2014-filtered", "test-filtered", "sgm",
            {"de": "test/newstest2014-deen-src.de.sgm", "en": "test/newstest2014-deen-ref.en.sgm"},
            lines=2737,
        ),
        "en-fr": Corpus(
            "newstest2014-filtered", "test-filtered", "sgm",
            {"en": "test/newstest2014-fren-src.en.sgm", "fr": "test/newstest2014-fren-ref.fr.sgm"},
        ),
        "fr-en": Corpus(
            "newstest2014-filtered", "test-filtered", "sgm",
            {"fr": "test/newstest2014-fren-src.fr.sgm", "en": "test/newstest2014-fren-ref.en.sgm"},
        ),
    },
}


# ----------------------------------------------------------------------------- look-ups


def split_pair(pair: str) -> tuple[str, str]:
    """``"en-de"`` -> ``("en", "de")``."""
    src, _, tgt = pair.partition("-")
    if not src or not tgt or src == tgt:
        raise StageError(f"language pair {pair!r} must be src-tgt, e.g. en-de")
    return src, tgt


def statmt_pair(pair: str) -> str:
    """statmt.org's name for a pair, whichever the direction: en-de and de-en are both ``de-en``."""
    src, tgt = split_pair(pair)
    if "en" not in (src, tgt):
        raise StageError(f"WMT14 pairs all include English; {pair!r} does not")
    other = tgt if src == "en" else src
    return f"{other}-en"


def archive(key: str) -> Archive:
    """The archive registered under ``key``."""
    try:
        return ARCHIVES[key]
    except KeyError:
        raise StageError(f"no archive {key!r} in the registry (known: {', '.join(ARCHIVES)})") from None


def train_corpora(pair: str, names: Sequence[str] = ()) -> list[Corpus]:
    """The named training corpora for ``pair`` (the registry's default set when ``names`` is empty)."""
    key = statmt_pair(pair)
    table = TRAIN.get(key)
    if table is None:
        raise StageError(f"no WMT14 training data registered for {pair} (known: {_pairs(TRAIN)})")
    names = tuple(names) or DEFAULT_TRAIN[key]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise StageError(
            f"unknown corpus {unknown[0]!r} for {pair} (known: {', '.join(table)})"
        )
    return [table[n] for n in dict.fromkeys(names)]


def get_dev(name: str, pair: str) -> Corpus:
    """The named development set for ``pair``."""
    table = DEV.get(name)
    if table is None:
        raise StageError(f"unknown dev set {name!r} (known: {', '.join(DEV)})")
    corpus = table.get(statmt_pair(pair))
    if corpus is None:
        raise StageError(f"dev set {name} has no {pair} data (known: {_pairs(table)})")
    return corpus


def get_test(name: str, variant: str, pair: str) -> Corpus:
    """The named test set release for the direction ``pair``."""
    table = TEST.get((name, variant))
    if table is None:
        known = ", ".join(f"{n} ({v})" for n, v in TEST)
        raise StageError(f"unknown test set {name!r} ({variant}) (known: {known})")
    corpus = table.get(pair)
    if corpus is None:
        raise StageError(f"test set {name} ({variant}) has no {pair} data (known: {_pairs(table)})")
    return corpus


def _pairs(table: Mapping[str, object]) -> str:
    return ", ".join(table)
