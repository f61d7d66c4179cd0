"""The quickstart's offline corpus: English-German pairs generated from a small bilingual grammar
(``corpora.synthetic_grammar``).

It is honest about what it is: a deterministic grammar, not real text. But it is not a cipher
either: agreement, verb-second and verb-final order, the sentence bracket. A small Transformer
has to learn reordering and agreement, not word-for-word copying. ``data.synthetic_domain``
draws another corpus from the same grammar with a domain's own nouns in most noun slots.

``write_corpus(out_dir, ...)`` writes the raw corpus layout (``corpora.assemble``) for corpus
``synthetic``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from corpora import CorpusError
from corpora import synthetic_lexicon as lex
from corpora.synthetic_grammar import Grammar

__all__ = ["write_corpus", "generate_pairs", "Grammar", "CORPUS", "DOMAINS", "PAIRS"]

PAIRS = ("en-de", "de-en")
"""The directions the grammar writes."""

CORPUS = "synthetic"
MIN_WORDS, MAX_WORDS = 4, 30
DOMAINS = tuple(lex.DOMAIN_NOUNS)
"""``data.synthetic_domain``'s choices: the general grammar with a domain's nouns in it."""


# ----------------------------------------------------------------------------- corpus


def generate_pairs(
    n: int, seed: int | str, *, exclude: set[str] | None = None, domain: str | None = None
) -> list[tuple[str, str]]:
    """``n`` pairs of 4..30 words per side from the seed's own stream (with ``domain``, the
    grammar with that domain's nouns in it).

    With ``exclude``, no sentence (either side) is in it, and each accepted sentence is added to
    it, so the pairs are also distinct among themselves.
    """
    rng = random.Random(f"synthetic:{seed}")
    grammar = Grammar(rng, domain)
    pairs: list[tuple[str, str]] = []
    attempts = 0
    while len(pairs) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise CorpusError(
                f"synthetic grammar could not make {n} distinct pairs (got {len(pairs)})"
            )
        en, de = grammar.sentence()
        if not (
            MIN_WORDS <= len(en.split()) <= MAX_WORDS and MIN_WORDS <= len(de.split()) <= MAX_WORDS
        ):
            continue
        if exclude is not None:
            if en in exclude or de in exclude:
                continue
            exclude.update((en, de))
        pairs.append((en, de))
    return pairs


def write_corpus(
    out_dir: Path,
    *,
    pair: str,
    seed: int,
    train: int,
    dev: int,
    test: int,
    domain: str | None = None,
) -> dict[str, Any]:
    """Write ``train/synthetic.{en,de}``, ``dev.{en,de}``, ``test.{en,de}``; returns line counts.

    Train, dev and test come from separate streams of ``seed`` (and of ``domain``, whose corpus
    is another draw, not the general one's with words swapped); dev and test share no sentence
    (on either side) with train or with each other.
    """
    if pair not in PAIRS:
        raise CorpusError(f"data.pair: the synthetic corpus is English-German, not {pair!r}")
    if domain is not None and domain not in DOMAINS:
        raise CorpusError(f"data.synthetic_domain: {domain!r} is not one of {', '.join(DOMAINS)}")
    out_dir = Path(out_dir)
    (out_dir / "train").mkdir(parents=True, exist_ok=True)
    stream = f"{seed}:{domain}" if domain else f"{seed}"
    train_pairs = generate_pairs(train, f"{stream}:train", domain=domain)
    seen = {s for p in train_pairs for s in p}
    dev_pairs = generate_pairs(dev, f"{stream}:dev", exclude=seen, domain=domain)
    seen.update(s for p in dev_pairs for s in p)
    test_pairs = generate_pairs(test, f"{stream}:test", exclude=seen, domain=domain)
    for name, pairs in ((f"train/{CORPUS}", train_pairs), ("dev", dev_pairs), ("test", test_pairs)):
        for i, lang in enumerate(("en", "de")):
            text = "".join(p[i] + "\n" for p in pairs)
            (out_dir / f"{name}.{lang}").write_text(text, encoding="utf-8")
    return {
        "corpus": CORPUS,
        "train": len(train_pairs),
        "dev": len(dev_pairs),
        "test": len(test_pairs),
    }
