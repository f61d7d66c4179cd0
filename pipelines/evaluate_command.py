"""``tfm evaluate``: a registered version (or a checkpoint) translated and scored on test sets,
optionally compared set by set with another version (docs/evaluation.md).

Each set is translated in batches by the version with its own registered decoding (the path of
``tfm translate``), scored as the score stage scores (``evaluation.bleu``) and, with
``--against``, compared by sacreBLEU's paired bootstrap (``evaluation.compare``). The table is
printed; ``--json`` writes it (and a Markdown copy, and with ``--against`` a plot of the
differences, beside it); a registered version gets its figures as tags
(``evaluation.evidence.TAG_PREFIX``).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpora import CorpusError
from evaluation.compare import MetricComparison
from evaluation.evidence import TAG_PREFIX, figure_tags, tag_name
from tasks.framework.config import ConfigError, RunConfig

SHOWN = (("bleu_sacre", "sacreBLEU"), ("bleu_tok_compound", "tok BLEU"), ("chrf", "chrF"))
"""The table's figures and their headings."""
SIGNATURES = ("bleu_sacre", "bleu_tok_compound", "bleu_tok_lc", "chrf")


@dataclass(frozen=True)
class EvaluationSet:
    """Aligned sources and references, named."""

    name: str
    origin: str
    """Where it was read: a prefix, a TSV, or a work dir's download folder."""
    sources: list[str]
    refs: list[str]


@dataclass(frozen=True)
class SetResult:
    """One set's figures: the model's and, with ``--against``, the other's and the comparison."""

    test_set: EvaluationSet
    scores: dict[str, Any]
    against: dict[str, Any] | None = None
    comparison: list[MetricComparison] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "test_set": self.test_set.name,
            "origin": self.test_set.origin,
            "segments": len(self.test_set.refs),
            "scores": self.scores,
        }
        if self.against is not None:
            out["against_scores"] = self.against
            out["comparison"] = [c.as_dict() for c in self.comparison]
        return out


# ----------------------------------------------------------------------------- test sets


def read_test_set(spec: str, langs: tuple[str, str]) -> EvaluationSet:
    """``--test-set SPEC``: a TSV (``*.tsv``, ``*.tsv.gz``: source<TAB>target) or a prefix of
    aligned files ``SPEC.<src>``/``SPEC.<tgt>`` (plain or gzip), as ``source: local`` reads them;
    a missing or misaligned file is a ``CorpusError`` naming it."""
    from corpora.local_files import LocalCorpus, resolve

    path = Path(spec)
    if path.name.endswith((".tsv", ".tsv.gz")):
        if not path.is_file():
            raise CorpusError(f"test set {spec}: {path} does not exist")
        name = path.name.removesuffix(".gz").removesuffix(".tsv")
        corpus = LocalCorpus(name, {lang: path for lang in langs}, tsv=True)
    else:
        corpus = resolve(path.parent, path.name, langs)
        missing = corpus.missing()
        if missing:
            names = " and ".join(str(p) for p in missing)
            raise CorpusError(
                f"test set {spec}: {names} {'does' if len(missing) == 1 else 'do'} not exist "
                f"(a prefix names {spec}.<lang>[.gz] "
                f"for {' and '.join(langs)}, or give {spec}.tsv)"
            )
        name = path.name
    sources, refs = _copied(corpus, langs)
    if len(sources) != len(refs):
        src, tgt = (corpus.files[lang] for lang in langs)
        raise CorpusError(
            f"test set {spec}: {src} has {len(sources)} lines but {tgt} has {len(refs)}; "
            "the files must be line-aligned"
        )
    return _checked(EvaluationSet(name, spec, sources, refs))


def _copied(corpus: Any, langs: tuple[str, str]) -> tuple[list[str], list[str]]:
    """Both sides of a ``LocalCorpus`` as lines, read by ``corpora.local_files``'s readers."""
    from corpora.local_files import copy_corpus
    from corpora.text import read_lines

    with tempfile.TemporaryDirectory(prefix="tfm-evaluate-") as tmp:
        outputs = {lang: Path(tmp) / lang for lang in langs}
        copy_corpus(corpus, outputs)
        return read_lines(outputs[langs[0]]), read_lines(outputs[langs[1]])


def config_test_set(config: RunConfig) -> EvaluationSet:
    """The config's primary test set, named as the evaluate stage names it: its work dir's
    download stage's ``test.<src>``/``test.<tgt>``."""
    from corpora.text import read_lines
    from tasks.evaluate import primary_name
    from tasks.framework.workdir import open_workdir

    wd = open_workdir(config)
    roles = {"download": "download"}
    folder = wd.input_folders(roles, wd.input_fingerprints(roles))[0]["download"]
    src, tgt = config.languages
    sources, refs = read_lines(folder / f"test.{src}"), read_lines(folder / f"test.{tgt}")
    if len(sources) != len(refs):
        raise CorpusError(
            f"test set {folder}: test.{src} has {len(sources)} lines but test.{tgt} has "
            f"{len(refs)}; the files must be line-aligned"
        )
    return _checked(EvaluationSet(primary_name(config), wd.locate("download"), sources, refs))


def config_extra_sets(config: RunConfig) -> list[EvaluationSet]:
    """The config's other test sets (``eval.test_sets`` after the first): as the evaluate stage
    read them into its folder (``sets/<name>/test.<lang>``), else, for a set of your own files,
    read from its prefix; a built-in split the stage has not fetched yet is one line saying so."""
    from corpora.text import read_lines
    from tasks.framework.workdir import open_workdir

    extra = config.eval.extra
    if not extra:
        return []
    wd = open_workdir(config)
    src, tgt = config.languages
    folder = None
    if wd.exists("evaluate"):  # this node's copy of the stage's folder
        roles = {"evaluate": "evaluate"}
        folder = wd.input_folders(roles, wd.input_fingerprints(roles))[0]["evaluate"]
    found = []
    for s in extra:
        read = None if folder is None else folder / "sets" / s.name
        if read is not None and (read / f"test.{src}").is_file():
            sources, refs = read_lines(read / f"test.{src}"), read_lines(read / f"test.{tgt}")
            origin = f"{wd.locate('evaluate')}/sets/{s.name}"
            found.append(_checked(EvaluationSet(s.name, origin, sources, refs)))
        elif s.prefix is not None:
            one = read_test_set(s.prefix, (src, tgt))
            found.append(EvaluationSet(s.name, one.origin, one.sources, one.refs))
        else:
            raise ConfigError(
                f"eval.test_sets[{s.name}]",
                f"split {s.split} is not fetched yet: run `tfm stage evaluate --config ...` "
                "first (it downloads the built-in splits), or give --test-set",
            )
    return found


def _checked(test_set: EvaluationSet) -> EvaluationSet:
    if not test_set.refs:
        raise CorpusError(f"test set {test_set.origin} is empty (0 segments)")
    return test_set


# ----------------------------------------------------------------------------- evaluation

Translate = Callable[[list[str]], list[Any]]
"""Texts in, one translation per text out (``serving.stream.Predict``)."""


def evaluate_sets(
    test_sets: Sequence[EvaluationSet],
    lang: str,
    translate: Translate,
    against: Translate | None = None,
    say: Callable[[str], object] = print,
) -> list[SetResult]:
    """Each set translated by ``translate`` (and ``against``) and scored on its references."""
    from evaluation.bleu import score_texts
    from evaluation.compare import compare_systems

    results = []
    for test_set in test_sets:
        systems = "both models" if against is not None else "the model"
        say(f"{test_set.name}: {len(test_set.refs)} sentences, translated by {systems} ...")
        hyps = translate(test_set.sources)
        scores = score_texts(hyps, test_set.refs, lang)
        if against is None:
            results.append(SetResult(test_set, scores))
            continue
        other = against(test_set.sources)
        results.append(
            SetResult(
                test_set,
                scores,
                score_texts(other, test_set.refs, lang),
                compare_systems(test_set.refs, hyps, other, lang),
            )
        )
    return results


def table(results: Sequence[SetResult], markdown: bool = False) -> str:
    """The figures as a table: a row per set, or with a comparison a row per set and metric."""
    compared = any(r.against is not None for r in results)
    if compared:
        head = ["set", "sentences", "metric", "model", "against", "difference", "95% interval", "p"]
        rows = [
            [
                r.test_set.name,
                str(len(r.test_set.refs)),
                c.metric,
                f"{c.a:.2f}",
                f"{c.b:.2f}",
                f"{c.difference:+.2f}",
                f"[{c.low:+.2f}, {c.high:+.2f}]",
                f"{c.p_value:.4f}",
            ]
            for r in results
            for c in r.comparison
        ]
    else:
        head = ["set", "sentences", *(title for _, title in SHOWN)]
        rows = [
            [r.test_set.name, str(len(r.test_set.refs))]
            + [f"{r.scores[key]:.2f}" for key, _ in SHOWN]
            for r in results
        ]
    if markdown:
        lines = [head, ["---"] * len(head), *rows]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    text_columns = (0, 2) if compared else (0,)  # set and metric: left-aligned
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in text_columns else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [head, *rows]
    )


def signatures(results: Sequence[SetResult]) -> list[str]:
    """One line per metric: its sacreBLEU signature (the same on every set)."""
    if not results:
        return []
    first = results[0].scores
    lines = [f"{key}: {first[f'{key}_signature']}" for key in SIGNATURES]
    if results[0].comparison:
        lines.append(f"paired test: {_resamples(results[0].comparison[0].signature)}")
    return lines


def _resamples(signature: str) -> str:
    found = re.search(r"bs:(\d+)\|seed:([^|]+)", signature)
    if found is None:
        return signature
    return f"paired bootstrap, {found.group(1)} resamples, seed {found.group(2)}"


# ----------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class Request:
    """What ``tfm evaluate`` was asked, its config loaded (``pipelines.commands``)."""

    model: str | None
    """A registered model's URI ..."""
    checkpoint: Path | None
    """... or a checkpoint and its tokenizer folder."""
    tokenizer: Path | None
    config: RunConfig | None
    tracking_uri: str | None
    test_sets: list[str]
    """``--test-set`` prefixes or TSVs; none: the config's test set."""
    against: str | None
    json_path: Path | None


def run(request: Request, say: Callable[[str], object] = print) -> int:
    """Translate, score, print; write ``--json`` (and its .md, .png); tag the version."""
    from serving import registered_version, stream

    config, tracking = request.config, request.tracking_uri
    version = None
    if request.model is not None:
        name, number, _ = registered_version.resolve(request.model, tracking)
        version = (name, number)
        say(f"model: {request.model} ({name} version {number})")
    elif request.checkpoint is None or request.tokenizer is None:
        raise ConfigError("", "--checkpoint needs --tokenizer DIR (the folder holding spm.model)")
    else:
        say(f"model: {request.checkpoint}")
    langs = config.languages if config is not None else _registered_pair(version, tracking)
    sets = _test_sets(request, langs)
    translate = _translator(request, version)
    against = None
    if request.against is not None:
        other, other_number, _ = registered_version.resolve(request.against, tracking)
        say(f"against: {request.against} ({other} version {other_number})")
        against = stream.from_registry(registered_version.pinned_uri(other, other_number), tracking)
    results = evaluate_sets(sets, langs[1], translate, against, say)
    say("")
    say(table(results))
    say("")
    for line in signatures(results):
        say(line)
    if request.json_path is not None:
        say("wrote " + ", ".join(str(p) for p in write_outputs(request, results)))
    if version is not None:
        names = [tag_name(r.test_set.name) for r in results]
        say(
            tag_version(
                version, tracking, figure_tags({r.test_set.name: r.scores for r in results}), names
            )
        )
    return 0


def _translator(request: Request, version: tuple[str, int] | None) -> Translate:
    """The version pinned (its alias followed once), or the checkpoint with the config's
    decoding: ``tfm translate``'s batched path."""
    from serving import registered_version, stream
    from serving.translator import DecodeConfig

    if version is not None:
        return stream.from_registry(registered_version.pinned_uri(*version), request.tracking_uri)
    if request.checkpoint is None or request.tokenizer is None:
        raise ConfigError("", "--checkpoint needs --tokenizer DIR (the folder holding spm.model)")
    decode = request.config.decoding if request.config is not None else DecodeConfig()
    return stream.from_checkpoint(request.checkpoint, request.tokenizer, decode)


def _test_sets(request: Request, langs: tuple[str, str]) -> list[EvaluationSet]:
    if not request.test_sets:
        if request.config is None:
            raise ConfigError("", "give --test-set PREFIX_OR_TSV, or --config (its test set)")
        return [config_test_set(request.config), *config_extra_sets(request.config)]
    sets = [read_test_set(spec, langs) for spec in request.test_sets]
    names = [tag_name(s.name) for s in sets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # their tags and rows would be one
        raise ConfigError(
            "--test-set", f"two test sets named {', '.join(twice)}: give each set its own name"
        )
    return sets


def _registered_pair(version: tuple[str, int] | None, tracking: str | None) -> tuple[str, str]:
    """The language pair of the config a version was registered by (its ``config`` tag)."""
    from corpora.sources import split_pair
    from serving.registered_version import version_tags

    if version is not None:
        tags = version_tags(version[0], version[1], tracking)
        pair = json.loads(tags.get("config", "{}")).get("data", {}).get("pair")
        if pair:
            return split_pair(pair)
    raise ConfigError("", "give --config: its data.pair names the test sets' languages")


def write_outputs(request: Request, results: Sequence[SetResult]) -> list[Path]:
    """``--json PATH``: the figures as JSON, the table as Markdown beside it (``.md``) and, with
    a comparison, the differences drawn beside it (``.png``); the files written."""
    from evaluation.compare import plot_differences

    path = request.json_path
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "model": request.model or str(request.checkpoint),
        "against": request.against,
        "sets": [r.as_dict() for r in results],
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    markdown = path.with_suffix(".md")
    lines = [table(results, markdown=True), "", *(f"- {line}" for line in signatures(results))]
    markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written = [path, markdown]
    if request.against is not None:
        plot = path.with_suffix(".png")
        rows = {r.test_set.name: r.comparison for r in results}
        plot_differences(rows, plot, f"{record['model']} - {request.against}")
        written.append(plot)
    return written


def tag_version(
    version: tuple[str, int], tracking: str | None, tags: dict[str, str], names: list[str]
) -> str:
    """Set ``tags`` on the version; the line that says so, or that the server did not answer."""
    from serving.registered_version import set_version_tags
    from tracking.sender import reason

    name, number = version
    try:
        set_version_tags(name, number, tags, tracking)
    except Exception as exc:  # noqa: BLE001 - the table is printed; the tags are extra
        return (
            f"not logged on {name} version {number}: the tracking server did not take the "
            f"tags ({reason(exc)})"
        )
    return f"logged on {name} version {number}: {TAG_PREFIX}.<set>.* tags for {', '.join(names)}"
