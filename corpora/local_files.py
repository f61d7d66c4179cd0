"""A team's own parallel text on disk (``data.source: local``): the files a prefix names, and
reading them into line-aligned files.

A prefix in ``data.local_dir`` (``train``, ``dev``, ``test`` or any other) names either two
line-aligned files, ``<prefix>.<src>`` and ``<prefix>.<tgt>``, each of which may be gzipped
(``<prefix>.<lang>.gz``), or one two-column TSV of pairs, ``<prefix>.tsv`` or
``<prefix>.tsv.gz``: ``source<TAB>target`` on each line, in ``data.pair``'s order. Gzip is told
by its magic bytes, so a gzipped file under a plain name reads too. A prefix holding both forms is
refused rather than guessed, and a TSV line without exactly two columns fails naming the file and
the line (the caller checks that two files have the same number of lines).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corpora import CorpusError
from corpora.archives import corrupt_archive
from corpora.text import LineWriter, read_text_lines, read_tsv

__all__ = ["LocalCorpus", "copy_corpus", "fingerprinted_files", "resolve"]

GZIP_MAGIC = b"\x1f\x8b"
# What reading a gzip file that ends early or fails its CRC raises.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


@dataclass(frozen=True)
class LocalCorpus:
    """The files one prefix names: one per language, or one TSV holding both."""

    prefix: str
    files: dict[str, Path]
    """Language -> the file holding it (for a TSV, every language names the same file)."""
    tsv: bool
    """Whether ``files`` is one two-column TSV (source, target) rather than a file per side."""

    def missing(self) -> list[Path]:
        """The files that do not exist."""
        return [p for p in dict.fromkeys(self.files.values()) if not p.is_file()]


def _existing(folder: Path, names: Sequence[str]) -> list[Path]:
    return [folder / n for n in names if (folder / n).is_file()]


def resolve(folder: Path, prefix: str, langs: tuple[str, str]) -> LocalCorpus:
    """The files ``prefix`` names in ``folder`` (module doc); when none exist, the plain pair
    (``missing`` says so). Two forms of one prefix at once are an error naming them."""
    tsv = _existing(folder, [f"{prefix}.tsv", f"{prefix}.tsv.gz"])
    sides = {lang: _existing(folder, [f"{prefix}.{lang}", f"{prefix}.{lang}.gz"]) for lang in langs}
    found = [*tsv, *(p for paths in sides.values() for p in paths)]
    if len(tsv) > 1 or (tsv and len(found) > 1) or any(len(p) > 1 for p in sides.values()):
        names = ", ".join(p.name for p in found)
        raise CorpusError(
            f"data.local_dir {folder}: prefix {prefix!r} names {names}: keep one form "
            f"(<prefix>.<lang>[.gz] per side, or one <prefix>.tsv[.gz])"
        )
    if tsv:
        return LocalCorpus(prefix, {lang: tsv[0] for lang in langs}, tsv=True)
    files = {
        lang: paths[0] if paths else folder / f"{prefix}.{lang}" for lang, paths in sides.items()
    }
    return LocalCorpus(prefix, files, tsv=False)


def fingerprinted_files(folder: Path, prefix: str, langs: tuple[str, str]) -> list[Path]:
    """What the download stage hashes for ``prefix``: every file of either form that exists, and
    the plain name of a side that has none (so a missing file shows, and the stage names it)."""
    tsv = _existing(folder, [f"{prefix}.tsv", f"{prefix}.tsv.gz"])
    files = list(tsv)
    for lang in langs:
        sides = _existing(folder, [f"{prefix}.{lang}", f"{prefix}.{lang}.gz"])
        files.extend(sides or ([] if tsv else [folder / f"{prefix}.{lang}"]))
    return files


def _open(path: Path) -> io.BufferedIOBase:
    """``path`` as bytes, decompressed when it starts with gzip's magic bytes."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def copy_corpus(corpus: LocalCorpus, outputs: dict[str, Path]) -> dict[str, LineWriter]:
    """Write each language of ``corpus`` to its file in ``outputs``, one segment per line; the
    closed writers (their line counts). A ragged TSV line or a corrupt gzip file fails naming
    the file."""
    writers: dict[str, LineWriter] = {}
    try:
        if corpus.tsv:
            writers = {lang: LineWriter(out) for lang, out in outputs.items()}
            _copy_tsv(next(iter(corpus.files.values())), list(writers.values()))
        else:
            for lang, path in corpus.files.items():
                writers[lang] = LineWriter(outputs[lang])
                _copy_lines(path, writers[lang])
    finally:
        for writer in writers.values():
            writer.close()
    return writers


def _copy_lines(path: Path, writer: LineWriter) -> None:
    with _open(path) as f:
        try:
            for line in read_text_lines(f):
                writer.write(line)
        except _GZIP_ERRORS as exc:
            raise corrupt_archive(path, exc) from None


def _copy_tsv(path: Path, writers: list[LineWriter]) -> None:
    with _open(path) as f:
        try:
            for row in read_tsv(read_text_lines(f), len(writers)):
                for writer, segment in zip(writers, row, strict=True):
                    writer.write(segment)
        except ValueError as exc:  # read_tsv's "line N: ..."
            cat = "zcat" if path.suffix == ".gz" else "cat"
            raise CorpusError(
                f"{path}, {exc} (each line is source<TAB>target; to drop such lines: "
                f"{cat} {path.name} | awk -F'\\t' 'NF==2' > fixed.tsv)"
            ) from None
        except _GZIP_ERRORS as exc:
            raise corrupt_archive(path, exc) from None
