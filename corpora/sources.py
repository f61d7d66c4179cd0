"""The source registry: where each WMT14 and Multi30k corpus lives and which files hold it.

Training corpora are tables here: statmt.org publishes no list of them anyone else keeps. The
dev and test sets (newstest2013, newstest2014 full and filtered) come from sacreBLEU's own
dataset registry (URL, md5, SGM members per direction), the table every BLEU user trusts;
we still download them ourselves, through mirrors, the lock file and safe extraction.

Archive paths are relative to ``https://www.statmt.org/`` (a mirror keeps them); member paths
are exactly as they appear inside the archives. Checksums are ``None`` where nobody publishes
one; the download stage then pins what it saw first in a lock file (see docs/data.md).

Multi30k (task 1: image captions, English with German, French and Czech translations) is a
table of its splits: each split and language is a gzipped text file of its own in the
multi30k/dataset repository, relative to ``MULTI30K`` (a mirror keeps those paths too). Files
whose public bytes never change carry their sha256 here (``MULTI30K_SHA256``), so that every
download is checked against the published file, in a fresh work dir too, whichever mirror
served it; the others are pinned by the lock file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from corpora import CorpusError

STATMT = "https://www.statmt.org/"
MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/master/"

Format = Literal["text", "gzip", "sgm", "tsv"]
"""text: one segment per line; gzip: the same, gzipped; sgm: WMT's <seg> files; tsv: one member
with a column per language."""


@dataclass(frozen=True)
class Archive:
    """One downloadable file."""

    path: str
    """Path after ``base`` (a mirror serves the same path)."""
    bytes: int | None = None
    """Expected size, when known."""
    sha256: str | None = None
    """Expected sha256, when published."""
    md5: str | None = None
    """Expected md5, when published (sacrebleu's dataset table has them for the test sets)."""
    base: str = STATMT
    """Where the source publishes it; ``data.mirror`` replaces this part of the URL."""

    @property
    def url(self) -> str:
        """The canonical URL (also the key in the lock file)."""
        return self.base + self.path


@dataclass(frozen=True)
class Corpus:
    """One parallel text: its archive, the member that holds each language, and their format."""

    name: str
    """Corpus name; names the output files (``train/<name>.<lang>``)."""
    archive: str
    """Key of its archive: into ``ARCHIVES``, or a sacreBLEU dataset (``wmt14/full``); or
    ``multi30k``, whose members are files of their own (``multi30k_file``)."""
    format: Format
    """How the members are written."""
    members: Mapping[str, str]
    """Language -> member path inside the archive (for tsv, every language names the same
    member)."""
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
            "europarl-v7",
            "europarl-v7",
            "text",
            {"de": "training/europarl-v7.de-en.de", "en": "training/europarl-v7.de-en.en"},
        ),
        "commoncrawl": Corpus(
            "commoncrawl",
            "commoncrawl",
            "text",
            {"de": "commoncrawl.de-en.de", "en": "commoncrawl.de-en.en"},
        ),
        "news-commentary-v9": Corpus(
            "news-commentary-v9",
            "news-commentary-v9",
            "text",
            {
                "de": "training/news-commentary-v9.de-en.de",
                "en": "training/news-commentary-v9.de-en.en",
            },
        ),
    },
    "fr-en": {
        "europarl-v7": Corpus(
            "europarl-v7",
            "europarl-v7",
            "text",
            {"fr": "training/europarl-v7.fr-en.fr", "en": "training/europarl-v7.fr-en.en"},
        ),
        "commoncrawl": Corpus(
            "commoncrawl",
            "commoncrawl",
            "text",
            {"fr": "commoncrawl.fr-en.fr", "en": "commoncrawl.fr-en.en"},
        ),
        "news-commentary-v9": Corpus(
            "news-commentary-v9",
            "news-commentary-v9",
            "text",
            {
                "fr": "training/news-commentary-v9.fr-en.fr",
                "en": "training/news-commentary-v9.fr-en.en",
            },
        ),
        "un": Corpus(
            "un",
            "un",
            "text",
            {"fr": "un/undoc.2000.fr-en.fr", "en": "un/undoc.2000.fr-en.en"},
        ),
        "giga-fren": Corpus(
            "giga-fren",
            "giga-fren",
            "gzip",
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


# ----------------------------------------------------------------------------- Multi30k (task 1)
# data/task1/raw/<split>.<lang>.gz in the multi30k/dataset repository, one gzipped file per split
# and language (English, and its German, French and Czech translations). Czech came with WMT18's
# multimodal task, after the 2017 test sets: the repository has no test_2017_*.cs.gz. The counts
# are the repository README's for train, val and the 2016/2017 tests; test_2018_flickr's 1,071 is
# the WMT18 multimodal test set's (the README lists neither it nor Czech).

MULTI30K_LANGUAGES = ("en", "de", "fr", "cs")
MULTI30K_DEV, MULTI30K_TEST = "val", "test_2016_flickr"
"""The standard dev and test sets (test_2016_flickr: the test set most Multi30k results report)."""


def _multi30k(
    split: str, languages: Sequence[str], lines: int, *, name: str | None = None
) -> Corpus:
    members = {lang: f"data/task1/raw/{split}.{lang}.gz" for lang in languages}
    return Corpus(name or split, "multi30k", "gzip", members, lines=lines)


# The files under data/task1/raw/, one line each as sha256sum writes it.
_MULTI30K_SUMS = """
d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f  train.en.gz
726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6  train.de.gz
622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c  train.fr.gz
14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28  val.en.gz
f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a  val.de.gz
ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9  val.fr.gz
611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9  test_2016_flickr.en.gz
9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8  test_2016_flickr.de.gz
6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90  test_2016_flickr.fr.gz
"""

MULTI30K_SHA256: dict[str, str] = {
    f"data/task1/raw/{name}": sha256
    for sha256, name in (line.split() for line in _MULTI30K_SUMS.strip().splitlines())
}
"""sha256 of the repository's files (commit a3d2e0d, gzipped in 2017 and unchanged since), as
computed from a copy of them; the Czech files and the 2017/2018 test sets are not pinned (no
copy was at hand to hash: the lock file pins them at their first download)."""

MULTI30K_TRAIN = _multi30k("train", MULTI30K_LANGUAGES, 29000, name="multi30k")
"""The training split; named ``multi30k`` like a WMT training corpus (``train/multi30k.<lang>``)."""

MULTI30K_EVAL: dict[str, Corpus] = {
    c.name: c
    for c in (
        _multi30k(MULTI30K_DEV, MULTI30K_LANGUAGES, 1014),
        _multi30k("test_2016_flickr", MULTI30K_LANGUAGES, 1000),
        _multi30k("test_2017_flickr", ("en", "de", "fr"), 1000),
        _multi30k("test_2017_mscoco", ("en", "de", "fr"), 461),
        _multi30k("test_2018_flickr", MULTI30K_LANGUAGES, 1071),
    )
}
"""The dev and test sets by split name."""

STANDARD_EVAL: dict[str, tuple[str, str]] = {
    "wmt14": ("newstest2013", "newstest2014"),
    "multi30k": (MULTI30K_DEV, MULTI30K_TEST),
}
"""data.source -> its (dev, test) when the config names none."""


# ----------------------------------------------------------------------------- look-ups


def split_pair(pair: str) -> tuple[str, str]:
    """``"en-de"`` -> ``("en", "de")``; a ValueError unless it names two different languages."""
    src, sep, tgt = pair.partition("-")
    if not sep or not src or not tgt or src == tgt or "-" in tgt:
        raise ValueError(
            f"language pair {pair!r} must be two different languages as src-tgt, e.g. en-de"
        )
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
    raise CorpusError(
        f"no archive {key!r} in the registry (known: {', '.join([*ARCHIVES, *EVAL_SETS.values()])})"
    )


def train_corpora(pair: str, names: Sequence[str] = ()) -> list[Corpus]:
    """The named training corpora for ``pair`` (the registry's default set when ``names`` is
    empty)."""
    key = statmt_pair(pair)
    table = TRAIN.get(key)
    if table is None:
        raise CorpusError(
            f"no WMT14 training data registered for {pair} (known: {', '.join(TRAIN)})"
        )
    names = tuple(names) or DEFAULT_TRAIN[key]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise CorpusError(f"unknown corpus {unknown[0]!r} for {pair} (known: {', '.join(table)})")
    return [table[n] for n in dict.fromkeys(names)]


def multi30k_file(member: str) -> Archive:
    """A Multi30k member (``data/task1/raw/val.de.gz``) as the file it is, under ``MULTI30K``,
    with its published sha256 where known."""
    return Archive(member, sha256=MULTI30K_SHA256.get(member), base=MULTI30K)


def multi30k_train(pair: str) -> Corpus:
    """Multi30k's training split for the direction ``pair`` (its two languages, source first)."""
    return _multi30k_sides(MULTI30K_TRAIN, "train", pair)


def multi30k_eval_set(name: str, pair: str) -> Corpus:
    """A Multi30k dev or test set (``val``, ``test_2016_flickr``, ...) for the direction
    ``pair``."""
    corpus = MULTI30K_EVAL.get(name)
    if corpus is None:
        raise CorpusError(
            f"unknown Multi30k dev/test set {name!r} (known: {', '.join(MULTI30K_EVAL)})"
        )
    return _multi30k_sides(corpus, name, pair)


def multi30k_test_sets() -> dict[str, dict[str, str]]:
    """Every Multi30k test set: name -> language -> canonical URL."""
    return {
        name: {lang: multi30k_file(member).url for lang, member in corpus.members.items()}
        for name, corpus in MULTI30K_EVAL.items()
        if name.startswith("test_")
    }


def _multi30k_sides(corpus: Corpus, split: str, pair: str) -> Corpus:
    """``corpus`` (the split ``split``) with the members of ``pair``'s languages only, source
    first; an error naming a language it lacks."""
    src, tgt = split_pair(pair)
    missing = [lang for lang in (src, tgt) if lang not in corpus.members]
    if missing:
        raise CorpusError(
            f"Multi30k {split} has no {missing[0]!r} text (it has {', '.join(corpus.members)})"
        )
    return dataclasses.replace(corpus, members={lang: corpus.members[lang] for lang in (src, tgt)})


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
