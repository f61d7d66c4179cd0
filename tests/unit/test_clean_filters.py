"""The clean stage's pure filters, one by one, with the counts they report (no Ray)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from corpora import cleaning, filters
from corpora.filters import CleanConfig
from corpora.parquet import TEXT_SCHEMA, ParquetShardWriter
from transformer_core.config_checks import ConfigError


def judge(pairs, config=CleanConfig(), contaminants=()):
    table = filters.clean_lines(
        [s.encode() if isinstance(s, str) else s for s, _ in pairs],
        [t.encode() if isinstance(t, str) else t for _, t in pairs],
        config,
        pa.array(list(contaminants), pa.string()),
    )
    reasons = table["reason"].to_numpy()
    if config.dedup:
        reasons = filters.mark_duplicates(reasons, table["hash"].to_numpy(), set())
    return filters.count_reasons(reasons), table


GOOD = ("the small dog sleeps", "der kleine Hund schläft")


def test_normalize_nfc_controls_and_whitespace():
    texts = ["cafe\u0301", " a\x00b\x7f\u200b c\t\td\u00a0e\r\n", "\ufeffHallo", "plain"]
    assert filters.normalize_array(pa.array(texts)).to_pylist() == [
        "caf\u00e9",
        "ab c d e",
        "Hallo",
        "plain",
    ]


def test_invalid_utf8_is_counted_and_dropped():
    counts, table = judge([GOOD, (b"bad \xff bytes", "ok"), ("ok", b"\xc3\x28")])
    assert counts["invalid_utf8"] == 2 and counts["kept"] == 1


def test_empty():
    counts, _ = judge([GOOD, ("", "nicht leer"), ("not empty", " \t "), ("\x00", "x")])
    assert counts["empty"] == 3 and counts["kept"] == 1


def test_length_limits():
    config = CleanConfig(min_len=2, max_len=5)
    counts, _ = judge([GOOD, ("one", "eins"), ("a b c d e f", "a b c d e f g")], config)
    assert counts["too_short"] == 1 and counts["too_long"] == 1 and counts["kept"] == 1


def test_character_limit_counts_code_points():
    config = CleanConfig(max_chars=10)
    pairs = [("a b c", "x y z"), ("ü" * 10, "ö" * 10), ("ok", "ü" * 11), ("x" * 11, "y" * 10)]
    counts, table = judge(pairs, config)
    assert counts["too_many_chars"] == 2 and counts["kept"] == 2
    assert table["reason"].to_pylist()[2:] == [filters.CODE["too_many_chars"]] * 2
    # too_long (whitespace tokens) comes first when both apply
    counts, _ = judge([(" ".join("w" * 6), "v")], CleanConfig(max_len=5, max_chars=3, max_ratio=9))
    assert counts["too_long"] == 1 and counts["too_many_chars"] == 0


def test_overlong_line_without_spaces_is_dropped_by_default():
    # one whitespace token per side: it passes every token filter, only the character bound sees it
    counts, _ = judge([GOOD, ("x" * 200_000, "y" * 200_000)])
    assert counts["too_many_chars"] == 1 and counts["too_long"] == 0 and counts["kept"] == 1
    with pytest.raises(ConfigError, match="max_chars"):
        CleanConfig(max_chars=0)


def test_ratio():
    counts, _ = judge([GOOD, ("a b c d", "w x"), ("a b c", "x y")])  # 2.0 dropped, 1.5 kept
    assert counts["ratio"] == 1 and counts["kept"] == 2
    counts, _ = judge([("a b c d", "w x")], CleanConfig(max_ratio=2.0))
    assert counts["ratio"] == 0


def test_identical():
    counts, _ = judge([GOOD, ("Berlin Paris", "Berlin Paris")])
    assert counts["identical"] == 1
    counts, _ = judge([("Berlin Paris", "Berlin Paris")], CleanConfig(drop_identical=False))
    assert counts["identical"] == 0


def test_duplicates_after_normalisation_keep_the_first():
    counts, table = judge(
        [GOOD, ("the  small dog sleeps", "der kleine Hund schläft "), GOOD, ("x y", "z w")]
    )
    assert counts["duplicate"] == 2 and counts["kept"] == 2
    counts, _ = judge([GOOD, GOOD], CleanConfig(dedup=False))
    assert counts["duplicate"] == 0


def test_duplicates_across_batches_share_the_seen_set():
    seen: set[int] = set()
    for expected in (0, 1):
        table = filters.clean_lines([GOOD[0].encode()], [GOOD[1].encode()], CleanConfig())
        reasons = filters.mark_duplicates(
            table["reason"].to_numpy(), table["hash"].to_numpy(), seen
        )
        assert filters.count_reasons(reasons)["duplicate"] == expected


def test_decontamination_on_either_side():
    contaminants = ["a planted test sentence", "ein Testsatz"]
    counts, _ = judge(
        [
            GOOD,
            ("a planted test sentence", "irgendwas ganz anderes hier"),
            ("some other text", "ein Testsatz"),
        ],
        contaminants=contaminants,
    )
    assert counts["contaminated"] == 2 and counts["kept"] == 1


def test_first_filter_wins_and_dropped_rows_carry_no_text():
    counts, table = judge([("", ""), ("a b c d e f", "a b c d e f")])
    assert counts["empty"] == 1 and counts["identical"] == 1
    assert table["src"].to_pylist() == ["", ""]
    assert sum(counts.values()) == 2


def test_hash_is_stable_and_pairwise():
    a = filters.pair_hashes(pa.array(["x", "x y"]), pa.array(["y z", "z"]))
    b = filters.pair_hashes(pa.array(["x", "x y"]), pa.array(["y z", "z"]))
    assert np.array_equal(a, b) and a[0] != a[1]


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_line_index_and_ranges(tmp_path, trailing_newline):
    lines = [f"line {i}".encode() for i in range(10)] + [b"", "ümlaut".encode()]
    path = tmp_path / "f.txt"
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    starts, n = cleaning.line_index(path, every=4)
    assert n == 12 and len(starts) == 3
    ends = starts[1:] + [path.stat().st_size]
    got = [
        line
        for s, e in zip(starts, ends, strict=True)
        for line in cleaning.read_range(str(path), s, e)
    ]
    assert got == lines


def test_line_index_empty_and_exact_multiple(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_bytes(b"")
    assert cleaning.line_index(empty, 3) == ([], 0)
    exact = tmp_path / "x.txt"
    exact.write_bytes(b"a\nb\nc\n")
    assert cleaning.line_index(exact, 3) == ([0], 3)


def test_shard_writer_splits_files(tmp_path):
    import pyarrow.parquet as pq

    writer = ParquetShardWriter(tmp_path, TEXT_SCHEMA, rows_per_file=3)
    writer.write(pa.table({"src": ["a", "b"], "tgt": ["x", "y"]}))
    writer.write(pa.table({"src": ["c", "d", "e"], "tgt": ["z", "w", "v"]}))
    files = writer.close()
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    assert [pq.read_metadata(f).num_rows for f in files] == [3, 2]
    assert pq.read_table(tmp_path)["src"].to_pylist() == ["a", "b", "c", "d", "e"]
