"""The run config's eval section: the test sets a trained model is judged on.

The first set is the primary one, the set ``data.test`` names, which the translate and score
stages decode and score; the others are the evaluate stage's (``tasks.evaluate``). A config
without the section has the primary set alone, as before it existed.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from corpora import CorpusError
from corpora.sources import eval_set, multi30k_eval_set
from tasks.framework.config_sections import DataConfig
from transformer_core.config_checks import ConfigError

__all__ = ["EvalConfig", "EvalSet", "check_test_sets"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _set_name(name: str) -> str:
    """A name that can be a folder's and an MLflow metric's suffix."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r}: a test set's name is letters, digits, _ . and - only")
    return name


SetName = Annotated[str, AfterValidator(_set_name)]
"""A test set's name: letters, digits, ``_``, ``.`` and ``-`` (it names a folder and metrics)."""


@dataclass(frozen=True, kw_only=True)
class EvalSet:
    """One test set: a built-in split of the data source, or files of your own."""

    name: SetName
    """Its name in the table, its folder and its MLflow metrics (bleu_sacre/<name>)."""
    split: str | None = None
    """A built-in set of data.source: multi30k's test_2016_flickr, test_2017_flickr,
    test_2017_mscoco, test_2018_flickr (or val); wmt14's newstest2013, newstest2014."""
    prefix: str | None = None
    """Your own files, in the forms source=local reads: <prefix>.<src> and <prefix>.<tgt> (either
    may be gzipped) or one <prefix>.tsv[.gz]; a relative path is from the CWD at load."""
    holdout: bool = True
    """Remove the training pairs that hold one of its sentences (either side), as clean removes
    the primary set's (the holdout stage, after clean): its figures are on unseen text, but
    adding or changing such a set retrains. false: training keeps them, the set is reported
    with its overlap with the training data, and adding it later translates and scores it
    alone."""

    def __post_init__(self) -> None:
        if self.split is not None and self.prefix is not None:
            raise ConfigError("prefix", "a test set is a split or a prefix, not both")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """The test sets a trained model is judged on (the evaluate stage)."""

    test_sets: tuple[EvalSet, ...] = ()
    """Named test sets, the first the primary one: the set data.test names, which translate and
    score decode and score (give it a name alone, or its split). The others are translated and
    scored by the evaluate stage, and removed from training unless holdout is false. Empty: the
    primary set alone."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.test_sets]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError("test_sets", f"{name!r} names two test sets")

    @property
    def extra(self) -> tuple[EvalSet, ...]:
        """The sets after the primary one: the evaluate stage's own."""
        return self.test_sets[1:]

    @property
    def held_out(self) -> tuple[EvalSet, ...]:
        """The extra sets removed from training (``holdout``): the holdout stage's."""
        return tuple(s for s in self.extra if s.holdout)

    def with_absolute_prefixes(self) -> EvalConfig:
        """A copy whose relative prefixes are absolute, from the CWD (what the loader keeps)."""
        sets = tuple(
            dataclasses.replace(s, prefix=str(Path(s.prefix).resolve())) if s.prefix else s
            for s in self.test_sets
        )
        return dataclasses.replace(self, test_sets=sets)


def check_test_sets(sets: tuple[EvalSet, ...], data: DataConfig) -> None:
    """The sets' rules against the data section: the first names data's test set, the others
    are a known split of its source or a prefix; a ConfigError under ``eval.test_sets[i]``."""
    if sets and data.source == "treebank":
        raise ConfigError(
            "eval.test_sets", "the parsing pipeline scores its test trees in parse_score"
        )
    for i, s in enumerate(sets):
        key = f"eval.test_sets[{i}]"
        if i == 0:
            _check_primary(s, data, key)
        elif s.split is None and s.prefix is None:
            raise ConfigError(key, f"{s.name!r} needs a split of data.source or a prefix")
        elif s.split is not None:
            _check_split(s.split, data, f"{key}.split")


def _check_primary(primary: EvalSet, data: DataConfig, key: str) -> None:
    """The primary set is data's test set: named alone, or by that split."""
    test = data.eval_sets[1]
    if not primary.holdout:
        raise ConfigError(
            f"{key}.holdout", "the primary set is data's test set, which clean always removes"
        )
    if primary.prefix is not None:
        raise ConfigError(
            f"{key}.prefix",
            "the first set is the primary one, data's test set: give it a name alone "
            "(data.local_test names a local corpus's)",
        )
    if primary.split is not None and (primary.split != test or data.source == "synthetic"):
        raise ConfigError(
            f"{key}.split",
            f"{primary.split!r}: the first set is the primary one, data's test set "
            f"({test if data.source != 'synthetic' else 'the synthetic test split'}); set "
            "data.test to change it, or give it a name alone",
        )


def _check_split(split: str, data: DataConfig, key: str) -> None:
    """``split`` is a set the data source has for its pair."""
    try:
        if data.source == "multi30k":
            multi30k_eval_set(split, data.pair)
        elif data.source == "wmt14":
            eval_set(split, "full", data.pair)
        else:
            raise ConfigError(
                key,
                f"{split!r}: data.source {data.source} has no built-in test sets; "
                "give a prefix of your own files",
            )
    except CorpusError as exc:
        raise ConfigError(key, str(exc)) from None
