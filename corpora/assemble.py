"""The raw corpus folder: one line-aligned UTF-8 file per corpus and language.

Layout (what the download stage publishes, docs/contracts.md): ``train/<corpus>.<src>``,
``train/<corpus>.<tgt>``, ``dev.<src>``, ``dev.<tgt>``, ``test.<src>``, ``test.<tgt>``.
``from_wmt14`` fills it from the registry's archives and ``from_multi30k`` from the registry's
Multi30k files (``corpora.sources``; both cached outside the folder, pinned in a lock file once
they read cleanly, dropped from the cache when they do not: ``corpora.pinned``), ``from_local`` from
a team's own files on disk (``corpora.local_files``: aligned files, gzipped or not, or a TSV);
the synthetic grammar writes the same layout itself (``corpora.synthetic``). Each returns the
stats the download stage's manifest records.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corpora import CorpusError, local_files, sources
from corpora.archives import corrupt_archive, iter_members
from corpora.fetch import Seen, hash_file
from corpora.lockfile import LockFile
from corpora.pinned import fetch, pinned_once_read
from corpora.sources import Corpus, split_pair
from corpora.text import LineWriter, read_sgm, read_text_lines, read_tsv

__all__ = ["from_local", "from_local_set", "from_multi30k", "from_registry_set", "from_wmt14"]

log = logging.getLogger(__name__)

# (split, corpus, output file per language) for each corpus a folder gets.
_Plan = list[tuple[str, Corpus, dict[str, Path]]]
# What reading a gzipped stream that ends early or fails its CRC raises.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def from_wmt14(
    out: Path,
    *,
    pair: str,
    corpora: Sequence[str],
    dev: str,
    test: str,
    test_variant: str,
    mirror: str | None,
    cache: Path,
    lock_file: Path,
    max_retries: int,
) -> dict[str, Any]:
    """Download (or reuse from ``cache``) every archive the pair needs and stream the wanted
    members into ``out``."""
    src, tgt = split_pair(pair)
    plan: _Plan = [
        ("train", c, _outputs(out, "train", c.name, src, tgt))
        for c in sources.train_corpora(pair, corpora)
    ]
    plan.append(("dev", sources.eval_set(dev, "full", pair), _outputs(out, "dev", "", src, tgt)))
    plan.append(
        ("test", sources.eval_set(test, test_variant, pair), _outputs(out, "test", "", src, tgt))
    )
    by_archive: dict[str, _Plan] = {}
    for item in plan:
        for lang in (src, tgt):
            if lang not in item[1].members:
                raise CorpusError(f"registry corpus {item[1].name} has no {lang} member")
        by_archive.setdefault(item[1].archive, []).append(item)

    lock = LockFile(lock_file)
    corpora_stats: dict[str, Any] = {}
    for key, items in by_archive.items():
        archive = sources.archive(key)
        fetched = fetch(
            archive, Path(cache) / archive.path, mirror=mirror, lock=lock, max_retries=max_retries
        )
        with pinned_once_read([fetched], lock):
            corpora_stats.update(
                _read_archive(
                    out, fetched.path, items, (src, tgt), url=archive.url, seen=fetched.seen
                )
            )
    return _summary("wmt14", pair, corpora_stats, mirror=mirror, test_variant=test_variant)


def from_multi30k(
    out: Path,
    *,
    pair: str,
    dev: str,
    test: str,
    mirror: str | None,
    cache: Path,
    lock_file: Path,
    max_retries: int,
) -> dict[str, Any]:
    """Download (or reuse from ``cache``) the Multi30k task 1 files of the pair's two languages,
    train and the named dev and test sets (each a gzipped text file of its own), into ``out``.

    A split's two files are pinned in the lock file together once both read cleanly and align;
    otherwise both are dropped from the cache, so a rerun after fixing the mirror starts afresh.
    """
    src, tgt = split_pair(pair)
    plan = [
        ("train", sources.multi30k_train(pair)),
        ("dev", sources.multi30k_eval_set(dev, pair)),
        ("test", sources.multi30k_eval_set(test, pair)),
    ]
    lock = LockFile(lock_file)
    corpora_stats: dict[str, Any] = {}
    for split, corpus in plan:
        outputs = _outputs(out, split, corpus.name, src, tgt)
        fetched = {
            lang: fetch(
                sources.multi30k_file(member),
                Path(cache) / "multi30k" / member,
                mirror=mirror,
                lock=lock,
                max_retries=max_retries,
            )
            for lang, member in corpus.members.items()
        }
        with pinned_once_read(list(fetched.values()), lock):
            writers = _copy_text(
                {lang: f.path for lang, f in fetched.items()}, outputs, gzipped=True
            )
            lines = _check_corpus(corpus, writers)
        corpora_stats[_stat_key(split, corpus.name)] = {
            "split": split,
            "name": corpus.name,
            "lines": lines,
            "files": {lang: _rel(outputs[lang], out) for lang in (src, tgt)},
            "inputs": {
                lang: {"url": f.archive.url, "bytes": f.seen.bytes, "sha256": f.seen.sha256}
                for lang, f in fetched.items()
            },
            **_fixes(writers),
        }
    return _summary("multi30k", pair, corpora_stats, mirror=mirror)


def from_local(
    out: Path, *, pair: str, local_dir: str | None, train: Sequence[str], dev: str, test: str
) -> dict[str, Any]:
    """Copy each train prefix's, the dev prefix's and the test prefix's files in ``local_dir``
    into ``out``, one segment per line: ``<prefix>.<lang>`` (each may be gzipped) or one
    ``<prefix>.tsv[.gz]`` of pairs (``corpora.local_files``)."""
    if not local_dir:
        raise CorpusError("data.local_dir is required for data.source=local")
    folder = Path(local_dir)
    src, tgt = split_pair(pair)
    # (split, name, files, outputs) for each corpus
    plan: list[tuple[str, str, local_files.LocalCorpus, dict[str, Path]]] = []
    for split, prefix in [*(("train", p) for p in train), ("dev", dev), ("test", test)]:
        name = Path(prefix).name
        outputs = _outputs(out, split, name if split == "train" else "", src, tgt)
        plan.append((split, name, local_files.resolve(folder, prefix, (src, tgt)), outputs))
    missing = [str(p) for *_, corpus, _ in plan for p in corpus.missing()]
    if missing:
        raise CorpusError(
            f"data.source=local: missing file(s): {', '.join(missing)} (a side may be gzipped, "
            "<prefix>.<lang>.gz, or both sides one <prefix>.tsv[.gz])"
        )
    train_names = [name for split, name, *_ in plan if split == "train"]
    if len(set(train_names)) != len(train_names) or {"dev", "test"} & set(train_names):
        raise CorpusError(
            "data.local_train: corpus names must be distinct and not dev or test: "
            f"{', '.join(train_names)}"
        )

    corpora_stats: dict[str, Any] = {}
    for split, name, corpus, outputs in plan:
        writers = local_files.copy_corpus(corpus, outputs)
        lines = _check_aligned(
            name, {lang: (str(corpus.files[lang]), w) for lang, w in writers.items()}
        )
        seen = {path: hash_file(path) for path in dict.fromkeys(corpus.files.values())}
        corpora_stats[_stat_key(split, name)] = {
            "split": split,
            "name": name,
            "format": "tsv" if corpus.tsv else "text",
            "lines": lines,
            "files": {lang: _rel(outputs[lang], out) for lang in (src, tgt)},
            "inputs": {
                lang: {
                    "path": str(path.resolve()),
                    "bytes": seen[path].bytes,
                    "sha256": seen[path].sha256,
                }
                for lang, path in corpus.files.items()
            },
            **_fixes(writers),
        }
    return _summary("local", pair, corpora_stats, local_dir=str(folder.resolve()))


def from_registry_set(
    outputs: dict[str, Path],
    *,
    source: str,
    split: str,
    pair: str,
    mirror: str | None,
    cache: Path,
    lock_file: Path,
    max_retries: int,
) -> int:
    """One dev or test set of a built-in source (a Multi30k split, a WMT newstest set) into
    ``outputs`` (language -> file), fetched, cached and pinned as the download stage does;
    its line count."""
    src, tgt = split_pair(pair)
    lock = LockFile(lock_file)
    if source == "multi30k":
        corpus = sources.multi30k_eval_set(split, pair)
        fetched = {
            lang: fetch(
                sources.multi30k_file(member),
                Path(cache) / "multi30k" / member,
                mirror=mirror,
                lock=lock,
                max_retries=max_retries,
            )
            for lang, member in corpus.members.items()
        }
        with pinned_once_read(list(fetched.values()), lock):
            writers = _copy_text(
                {lang: f.path for lang, f in fetched.items()}, outputs, gzipped=True
            )
            return _check_corpus(corpus, writers)
    corpus = sources.eval_set(split, "full", pair)
    archive = sources.archive(corpus.archive)
    got = fetch(
        archive, Path(cache) / archive.path, mirror=mirror, lock=lock, max_retries=max_retries
    )
    with pinned_once_read([got], lock):
        plan: _Plan = [("test", corpus, outputs)]
        stats = _read_archive(
            outputs[src].parent, got.path, plan, (src, tgt), url=archive.url, seen=got.seen
        )
    return stats["test"]["lines"]


def from_local_set(outputs: dict[str, Path], prefix: Path, pair: str) -> int:
    """The files ``prefix`` names (``corpora.local_files``: a file per side, gzipped or not, or a
    TSV) into ``outputs`` (language -> file); its line count. Missing or misaligned files fail
    naming them."""
    src, tgt = split_pair(pair)
    corpus = local_files.resolve(prefix.parent, prefix.name, (src, tgt))
    missing = corpus.missing()
    if missing:
        raise CorpusError(
            f"missing file(s): {', '.join(map(str, missing))} (a side may be gzipped, "
            "<prefix>.<lang>.gz, or both sides one <prefix>.tsv[.gz])"
        )
    writers = local_files.copy_corpus(corpus, outputs)
    return _check_aligned(
        prefix.name, {lang: (str(corpus.files[lang]), w) for lang, w in writers.items()}
    )


# ----------------------------------------------------------------------------- archive members


def _read_archive(
    out: Path, archive: Path, items: _Plan, langs: tuple[str, str], *, url: str, seen: Seen
) -> dict[str, Any]:
    """Write the corpora of ``items`` out of ``archive`` (downloaded from ``url``) and check
    them; their stats by key."""
    writers = _convert(archive, items, langs)
    stats: dict[str, Any] = {}
    for split, corpus, outputs in items:
        corpus_writers = {lang: writers[(corpus.name, lang)] for lang in langs}
        lines = _check_corpus(corpus, corpus_writers)
        stats[_stat_key(split, corpus.name)] = {
            "split": split,
            "name": corpus.name,
            "url": url,
            "bytes": seen.bytes,
            "sha256": seen.sha256,
            "lines": lines,
            "members": {lang: corpus.members[lang] for lang in langs},
            "files": {lang: _rel(outputs[lang], out) for lang in langs},
            **_fixes(corpus_writers),
        }
    return stats


def _convert(
    archive: Path, items: _Plan, langs: tuple[str, str]
) -> dict[tuple[str, str], LineWriter]:
    """Stream the members of ``items`` out of ``archive`` into their output files."""
    routes: dict[str, list[tuple[Corpus, str, Path]]] = {}
    for _, corpus, outputs in items:
        for lang in langs:
            routes.setdefault(corpus.members[lang], []).append((corpus, lang, outputs[lang]))
    writers: dict[tuple[str, str], LineWriter] = {}
    try:
        for member, stream in iter_members(archive, routes):
            for corpus, lang, output in routes[member]:
                writers[(corpus.name, lang)] = LineWriter(output)
            _copy_member(archive, member, stream, routes[member], writers)
            for corpus, lang, _ in routes[member]:
                writers[(corpus.name, lang)].close()
    finally:
        for writer in writers.values():
            writer.close()
    return writers


def _copy_member(
    archive: Path,
    member: str,
    stream: Any,
    targets: list[tuple[Corpus, str, Path]],
    writers: dict[tuple[str, str], LineWriter],
) -> None:
    corpus = targets[0][0]
    if corpus.format == "gzip":
        stream = gzip.GzipFile(fileobj=stream, mode="rb")
    lines = read_text_lines(stream)
    try:
        if corpus.format == "tsv":
            outs = [(c.columns.index(lang), writers[(c.name, lang)]) for c, lang, _ in targets]
            for row in read_tsv(lines, len(corpus.columns)):
                for column, writer in outs:
                    writer.write(row[column])
            return
        segments = read_sgm(lines) if corpus.format == "sgm" else lines
        outs_plain = [writers[(c.name, lang)] for c, lang, _ in targets]
        for segment in segments:
            for writer in outs_plain:
                writer.write(segment)
    except ValueError as exc:
        raise CorpusError(f"member {member!r} of {archive} ({corpus.format}): {exc}") from None
    except _GZIP_ERRORS as exc:
        # A gzipped member ends early or fails its CRC (the tar around it read fine).
        raise corrupt_archive(archive, f"member {member!r}: {exc}") from None


# ----------------------------------------------------------------------------- text files


def _copy_text(
    inputs: dict[str, Path], outputs: dict[str, Path], *, gzipped: bool = False
) -> dict[str, LineWriter]:
    """Copy each language's text file (gzipped or plain) to its output, one segment per line;
    the closed writers. A gzip file that ends early or is corrupt fails naming it."""
    writers: dict[str, LineWriter] = {}
    try:
        for lang, path in inputs.items():
            writers[lang] = writer = LineWriter(outputs[lang])
            with (gzip.open if gzipped else open)(path, "rb") as f:
                try:
                    for line in read_text_lines(f):
                        writer.write(line)
                except _GZIP_ERRORS as exc:
                    raise corrupt_archive(path, exc) from None
    finally:
        for writer in writers.values():
            writer.close()
    return writers


# ----------------------------------------------------------------------------- helpers


def _outputs(out: Path, split: str, name: str, src: str, tgt: str) -> dict[str, Path]:
    if split == "train":
        return {lang: out / "train" / f"{name}.{lang}" for lang in (src, tgt)}
    return {lang: out / f"{split}.{lang}" for lang in (src, tgt)}


def _check_corpus(corpus: Corpus, writers: dict[str, LineWriter]) -> int:
    """The line count of a registry corpus whose sides (named by their members) must align; a
    count other than the published one is logged, not fatal; none at all is (``_check_aligned``)."""
    lines = _check_aligned(
        corpus.name, {lang: (corpus.members[lang], w) for lang, w in writers.items()}
    )
    if corpus.lines is not None and lines != corpus.lines:
        log.warning(
            "%s has %d segments; the published count is %d", corpus.name, lines, corpus.lines
        )
    return lines


def _check_aligned(name: str, sides: dict[str, tuple[str, LineWriter]]) -> int:
    """The common line count; a clear error naming the corpus and both counts if they differ."""
    counts = {lang: w.lines for lang, (_, w) in sides.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(
            f"{origin} ({lang}) has {counts[lang]} lines" for lang, (origin, _) in sides.items()
        )
        raise CorpusError(f"corpus {name} is misaligned: {detail}")
    lines = next(iter(counts.values()))
    empty = [origin for origin, w in sides.values() if w.lines == w.blank_lines]
    if empty:
        # An empty dev set would validate on one blank pair and an empty test set score nothing.
        verb = "holds" if len(empty) == 1 else "hold"
        raise CorpusError(
            f"corpus {name} is empty: {' and '.join(empty)} {verb} no text "
            f"({lines} lines, all blank)"
        )
    return lines


def _fixes(writers: dict[str, LineWriter]) -> dict[str, int]:
    return {
        "broken_lines": sum(w.broken_lines for w in writers.values()),
        "replacement_chars": sum(w.replacement_chars for w in writers.values()),
    }


def _stat_key(split: str, name: str) -> str:
    return name if split == "train" else split


def _rel(path: Path, out: Path) -> str:
    return path.relative_to(out).as_posix()


def _summary(source: str, pair: str, corpora: dict[str, Any], **extra: Any) -> dict[str, Any]:
    src, tgt = split_pair(pair)
    return {
        "source": source,
        "pair": pair,
        "src": src,
        "tgt": tgt,
        **extra,
        "corpora": corpora,
        "train_lines": sum(c["lines"] for c in corpora.values() if c["split"] == "train"),
        "dev_lines": corpora["dev"]["lines"],
        "test_lines": corpora["test"]["lines"],
    }
