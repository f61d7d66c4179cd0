"""A team's own corpus (``data.source: local``): aligned files gzipped or not, a TSV of pairs, and
one clear line for a ragged, misaligned, ambiguous or missing file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from corpora import CorpusError
from corpora.assemble import from_local
from corpora.local_files import fingerprinted_files
from corpora.text import read_lines

PAIRS = [("a house", "ein Haus"), ("the cat sleeps", "die Katze schläft"), ("red", "rot")]


def _write(path: Path, lines: list[str], *, gzipped: bool = False) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gzipped else data)


def _sides(folder: Path, prefix: str, *, gz_en: bool = False, gz_de: bool = False) -> None:
    _write(folder / f"{prefix}.en{'.gz' * gz_en}", [s for s, _ in PAIRS], gzipped=gz_en)
    _write(folder / f"{prefix}.de{'.gz' * gz_de}", [t for _, t in PAIRS], gzipped=gz_de)


def _tsv(folder: Path, prefix: str, rows: list[str], *, gzipped: bool = False) -> Path:
    path = folder / f"{prefix}.tsv{'.gz' * gzipped}"
    _write(path, rows, gzipped=gzipped)
    return path


def _assemble(folder: Path, out: Path) -> dict:
    return from_local(
        out, pair="en-de", local_dir=str(folder), train=["train"], dev="dev", test="test"
    )


def _one_line_error(folder: Path, out: Path) -> str:
    with pytest.raises(CorpusError) as err:
        _assemble(folder, out)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_gzipped_sides_read_by_suffix_or_by_their_magic_bytes(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    _sides(folder, "train", gz_en=True, gz_de=True)
    _sides(folder, "dev", gz_de=True)
    _sides(folder, "test")
    _write(folder / "test.de", [t for _, t in PAIRS], gzipped=True)  # gzip under a plain name
    stats = _assemble(folder, tmp_path / "out")
    out = tmp_path / "out"
    assert read_lines(out / "train" / "train.de") == [t for _, t in PAIRS]
    assert read_lines(out / "dev.en") == [s for s, _ in PAIRS]
    assert read_lines(out / "test.de") == [t for _, t in PAIRS]
    assert stats["corpora"]["train"]["inputs"]["en"]["path"].endswith("train.en.gz")
    assert (stats["train_lines"], stats["test_lines"]) == (3, 3)


def test_a_tsv_of_pairs_gives_both_sides_in_the_pairs_order(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [f"{s}\t{t}" for s, t in PAIRS]
    _tsv(folder, "train", rows, gzipped=True)
    _tsv(folder, "dev", rows)
    _sides(folder, "test")  # the forms mix across prefixes
    stats = _assemble(folder, tmp_path / "out")
    out = tmp_path / "out"
    assert read_lines(out / "train" / "train.en") == [s for s, _ in PAIRS]
    assert read_lines(out / "train" / "train.de") == [t for _, t in PAIRS]
    assert read_lines(out / "dev.de") == [t for _, t in PAIRS]
    assert stats["corpora"]["train"]["format"] == "tsv"
    assert stats["corpora"]["test"]["format"] == "text"


def test_a_ragged_tsv_line_names_the_file_and_the_line(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = _tsv(folder, "train", ["a\tb", "c\td", "e\tf\tg", "h\ti"], gzipped=True)
    _sides(folder, "dev")
    _sides(folder, "test")
    text = _one_line_error(folder, tmp_path / "out")
    assert text.startswith(f"{path}, line 3: 3 tab-separated fields, expected 2")
    _tsv(folder, "train", ["a\tb", "c\td", "e\tf", "h\ti"], gzipped=True)  # fixed: it reads
    assert _assemble(folder, tmp_path / "again")["train_lines"] == 4


def test_misaligned_sides_name_both_files_and_their_counts(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    _sides(folder, "train")
    _sides(folder, "dev")
    _write(folder / "test.en", ["one", "two", "three"])
    _write(folder / "test.de.gz", ["eins", "zwei"], gzipped=True)
    text = _one_line_error(folder, tmp_path / "out")
    assert text == (
        f"corpus test is misaligned: {folder / 'test.en'} (en) has 3 lines, "
        f"{folder / 'test.de.gz'} (de) has 2 lines"
    )


def test_a_prefix_in_two_forms_or_in_none_is_refused_naming_the_files(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    _sides(folder, "train")
    _tsv(folder, "train", ["a\tb"])
    _sides(folder, "dev")
    _write(folder / "test.en", ["x"])
    text = _one_line_error(folder, tmp_path / "out")
    assert "prefix 'train' names train.tsv, train.en, train.de: keep one form" in text
    (folder / "train.tsv").unlink()
    text = _one_line_error(folder, tmp_path / "out")
    assert text.startswith(f"data.source=local: missing file(s): {folder / 'test.de'} (")


def test_the_fingerprint_covers_the_files_a_prefix_reads(tmp_path: Path):
    folder = tmp_path
    assert fingerprinted_files(folder, "train", ("en", "de")) == [
        folder / "train.en",
        folder / "train.de",
    ]  # none there: the plain names, so the digest shows them missing
    _tsv(folder, "train", ["a\tb"], gzipped=True)
    assert fingerprinted_files(folder, "train", ("en", "de")) == [folder / "train.tsv.gz"]
    _write(folder / "dev.de.gz", ["x"], gzipped=True)
    assert fingerprinted_files(folder, "dev", ("en", "de")) == [
        folder / "dev.en",
        folder / "dev.de.gz",
    ]
