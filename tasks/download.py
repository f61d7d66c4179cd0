"""Stage 1, download: a parallel corpus in, one line-aligned UTF-8 folder out.

The output (docs/contracts.md) holds ``train/<corpus>.<src>``, ``train/<corpus>.<tgt>``,
``dev.<src>``, ``dev.<tgt>``, ``test.<src>`` and ``test.<tgt>``, with src/tgt from
``config.data.pair``. Sources: ``wmt14`` (statmt.org or a mirror, through the registry in
tasks/sources.py; archives are cached outside the stage folder and pinned in a lock file),
``synthetic`` (tasks/synthetic.py) and ``local`` (``<prefix>.<lang>`` files on disk).
"""

from __future__ import annotations

import gzip
import logging
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tasks import sources
from tasks.archives import iter_members
from tasks.artifacts import StageError, run_stage, sha256_file
from tasks.config import DataConfig, RunConfig
from tasks.corpus_io import LineWriter, read_sgm, read_text_lines, read_tsv
from tasks.fetch import Expected, LockFile, download, mirror_url
from tasks.sources import Corpus, split_pair

__all__ = [
    "cache_dir",
    "lock_path",
    "parallel_files",
    "read_parallel",
    "run",
    "stage_config",
    "split_pair",
]

log = logging.getLogger(__name__)

STAGE = "download"


def stage_config(config: RunConfig) -> DataConfig:
    """What this stage fingerprints: the data section."""
    return config.data


def run(config: RunConfig, inputs: dict[str, Path] | None = None, *, force: bool = False) -> Path:
    """Write ``<workdir>/download/`` from the configured source; returns the folder."""
    builders: dict[str, Callable[[Path, RunConfig], dict[str, Any]]] = {
        "wmt14": _build_wmt14,
        "local": _build_local,
        "synthetic": _build_synthetic,
    }
    source = config.data.source
    if source not in builders:
        raise StageError(
            f"data.source={source!r} is not read by the download stage"
            + (" (the treebank stage reads treebank files; run the parsing pipeline)" if source == "treebank" else "")
        )
    split_pair(config.data.pair)  # a clear error before any work

    def build(out: Path) -> dict[str, Any]:
        return builders[source](out, config)

    return run_stage(STAGE, config.root / STAGE, stage_config(config), {}, build, force=force)


def cache_dir(config: RunConfig) -> Path:
    """Where downloaded archives are kept between runs."""
    return Path(config.data.cache_dir) if config.data.cache_dir else config.root / "cache" / "downloads"


def lock_path(config: RunConfig) -> Path:
    """The lock file pinning each download's sha256 and size."""
    return Path(config.data.lock_file) if config.data.lock_file else config.root / "downloads.lock.json"


# ----------------------------------------------------------------------------- reading the output


def parallel_files(folder: Path, split: str, src: str, tgt: str) -> list[tuple[str, Path, Path]]:
    """``(corpus, src file, tgt file)`` of a download folder's split: each train corpus, or dev/test."""
    folder = Path(folder)
    if split in ("dev", "test"):
        pairs = [(split, folder / f"{split}.{src}", folder / f"{split}.{tgt}")]
    elif split == "train":
        names = sorted(p.name[: -len(src) - 1] for p in (folder / "train").glob(f"*.{src}"))
        pairs = [(n, folder / "train" / f"{n}.{src}", folder / "train" / f"{n}.{tgt}") for n in names]
        if not pairs:
            raise StageError(f"{folder / 'train'} has no *.{src} files")
    else:
        raise StageError(f"unknown split {split!r} (train, dev or test)")
    for _, s, t in pairs:
        for path in (s, t):
            if not path.is_file():
                raise StageError(f"{path} is missing")
    return pairs


def read_parallel(folder: Path, split: str, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """``(src, tgt)`` segment pairs of a download folder's split (train: every corpus in turn)."""
    for _, s, t in parallel_files(folder, split, src, tgt):
        with open(s, encoding="utf-8", newline="\n") as fs, open(t, encoding="utf-8", newline="\n") as ft:
            try:
                for a, b in zip(fs, ft, strict=True):
                    yield a.rstrip("\n"), b.rstrip("\n")
            except ValueError:
                raise StageError(f"{s} and {t} have different line counts") from None


# ----------------------------------------------------------------------------- sources


def _build_synthetic(out: Path, config: RunConfig) -> dict[str, Any]:
    from tasks.synthetic import write_corpus  # another module's job; imported only when used

    return write_corpus(out, config)


def _build_local(out: Path, config: RunConfig) -> dict[str, Any]:
    data = config.data
    if not data.local_dir:
        raise StageError("data.local_dir is required for data.source=local")
    folder = Path(data.local_dir)
    src, tgt = split_pair(data.pair)
    plan: list[tuple[str, str, dict[str, Path], dict[str, Path]]] = []  # split, name, inputs, outputs
    for prefix in data.local_train:
        name = Path(prefix).name
        plan.append(("train", name, _local_inputs(folder, prefix, src, tgt), _outputs(out, "train", name, src, tgt)))
    for split, prefix in (("dev", data.local_dev), ("test", data.local_test)):
        plan.append((split, Path(prefix).name, _local_inputs(folder, prefix, src, tgt), _outputs(out, split, "", src, tgt)))
    missing = [str(p) for *_, inputs, _ in plan for p in inputs.values() if not p.is_file()]
    if missing:
        raise StageError(f"data.source=local: missing file(s): {', '.join(missing)}")
    train_names = [name for split, name, *_ in plan if split == "train"]
    if len(set(train_names)) != len(train_names) or {"dev", "test"} & set(train_names):
        raise StageError(
            f"data.local_train: corpus names must be distinct and not dev or test: {', '.join(train_names)}"
        )

    corpora: dict[str, Any] = {}
    for split, name, inputs, outputs in plan:
        writers = {lang: LineWriter(outputs[lang]) for lang in (src, tgt)}
        try:
            for lang, writer in writers.items():
                with open(inputs[lang], "rb") as f:
                    for line in read_text_lines(f):
                        writer.write(line)
        finally:
            for writer in writers.values():
                writer.close()
        lines = _check_aligned(name, {lang: (str(inputs[lang]), w) for lang, w in writers.items()})
        corpora[_stat_key(split, name)] = {
            "split": split,
            "name": name,
            "lines": lines,
            "files": {lang: _rel(outputs[lang], out) for lang in (src, tgt)},
            "inputs": {
                lang: {"path": str(inputs[lang].resolve()), "bytes": inputs[lang].stat().st_size,
                       "sha256": sha256_file(inputs[lang])}
                for lang in (src, tgt)
            },
            **_fixes(writers),
        }
    return _summary("local", data, corpora, local_dir=str(folder.resolve()))


def _build_wmt14(out: Path, config: RunConfig) -> dict[str, Any]:
    data = config.data
    src, tgt = split_pair(data.pair)
    plan: list[tuple[str, Corpus, dict[str, Path]]] = [
        ("train", c, _outputs(out, "train", c.name, src, tgt)) for c in sources.train_corpora(data.pair, data.corpora)
    ]
    plan.append(("dev", sources.get_dev(data.dev, data.pair), _outputs(out, "dev", "", src, tgt)))
    plan.append(("test", sources.get_test(data.test, data.test_variant, data.pair), _outputs(out, "test", "", src, tgt)))
    by_archive: dict[str, list[tuple[str, Corpus, dict[str, Path]]]] = {}
    for item in plan:
        for lang in (src, tgt):
            if lang not in item[1].members:
                raise StageError(f"registry corpus {item[1].name} has no {lang} member")
        by_archive.setdefault(item[1].archive, []).append(item)

    cache = cache_dir(config)
    lock = LockFile(lock_path(config))
    corpora: dict[str, Any] = {}
    for key, items in by_archive.items():
        archive = sources.archive(key)
        url = mirror_url(archive.url, data.mirror)
        path = cache / archive.path
        expected = [
            Expected(archive.bytes, archive.sha256, archive.md5, origin="the registry (tasks/sources.py)"),
            lock.expected(archive.url),
        ]
        log.info("download: %s -> %s", url, path)
        seen = download(url, path, [e for e in expected if e is not None], max_retries=data.max_retries)
        lock.pin(archive.url, seen)
        writers = _convert(path, items, (src, tgt))
        for split, corpus, outputs in items:
            corpus_writers = {lang: writers[(corpus.name, lang)] for lang in (src, tgt)}
            lines = _check_aligned(
                corpus.name, {lang: (corpus.members[lang], w) for lang, w in corpus_writers.items()}
            )
            if corpus.lines is not None and lines != corpus.lines:
                log.warning("%s has %d segments; the published count is %d", corpus.name, lines, corpus.lines)
            corpora[_stat_key(split, corpus.name)] = {
                "split": split,
                "name": corpus.name,
                "url": archive.url,
                "bytes": seen.bytes,
                "sha256": seen.sha256,
                "lines": lines,
                "members": {lang: corpus.members[lang] for lang in (src, tgt)},
                "files": {lang: _rel(outputs[lang], out) for lang in (src, tgt)},
                **_fixes(corpus_writers),
            }
    return _summary("wmt14", data, corpora, mirror=data.mirror, test_variant=data.test_variant)


def _convert(
    archive: Path, items: list[tuple[str, Corpus, dict[str, Path]]], langs: tuple[str, str]
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
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise StageError(f"{archive}: corrupt or truncated archive ({type(exc).__name__}: {exc})") from None
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
        if len(outs_plain) == 1:
            write = outs_plain[0].write
            for segment in segments:
                write(segment)
        else:
            for segment in segments:
                for writer in outs_plain:
                    writer.write(segment)
    except ValueError as exc:
        raise StageError(f"member {member!r} of {archive} ({corpus.format}): {exc}") from None


# ----------------------------------------------------------------------------- helpers


def _outputs(out: Path, split: str, name: str, src: str, tgt: str) -> dict[str, Path]:
    if split == "train":
        return {lang: out / "train" / f"{name}.{lang}" for lang in (src, tgt)}
    return {lang: out / f"{split}.{lang}" for lang in (src, tgt)}


def _local_inputs(folder: Path, prefix: str, src: str, tgt: str) -> dict[str, Path]:
    return {lang: folder / f"{prefix}.{lang}" for lang in (src, tgt)}


def _check_aligned(name: str, sides: dict[str, tuple[str, LineWriter]]) -> int:
    """The common line count; a clear error naming the corpus and both counts if they differ."""
    counts = {lang: w.lines for lang, (_, w) in sides.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{origin} ({lang}) has {counts[lang]} lines" for lang, (origin, _) in sides.items())
        raise StageError(f"corpus {name} is misaligned: {detail}")
    return next(iter(counts.values()))


def _fixes(writers: dict[str, LineWriter]) -> dict[str, int]:
    return {
        "broken_lines": sum(w.broken_lines for w in writers.values()),
        "replacement_chars": sum(w.replacement_chars for w in writers.values()),
    }


def _stat_key(split: str, name: str) -> str:
    return name if split == "train" else split


def _rel(path: Path, out: Path) -> str:
    return path.relative_to(out).as_posix()


def _summary(source: str, data: DataConfig, corpora: dict[str, Any], **extra: Any) -> dict[str, Any]:
    src, tgt = split_pair(data.pair)
    return {
        "source": source,
        "pair": data.pair,
        "src": src,
        "tgt": tgt,
        **extra,
        "corpora": corpora,
        "train_lines": sum(c["lines"] for c in corpora.values() if c["split"] == "train"),
        "dev_lines": corpora["dev"]["lines"],
        "test_lines": corpora["test"]["lines"],
    }
