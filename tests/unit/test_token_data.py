"""Token data read from the shard stage's Arrow IPC files (``<shard>/arrow/<split>/``) through
memory maps: the same rows, lengths and batches as the Parquet shards read into memory, in views
of the page cache; shard folders without the IPC files still train (from Parquet, with a
warning)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpora.encoding import SHARD_SCHEMA
from corpora.parquet import ParquetShardWriter
from tasks.framework.damage import damage
from tasks.framework.manifest import read_manifest
from tasks.framework.runner import build_folder
from training.data import BatchStream, TokenData, ipc_folder, token_files

VOCAB = 300


def shard_rows(n: int, seed: int) -> pa.Table:
    """``n`` shard rows of random ids (lengths 1..12, ending with EOS = 3)."""
    rng = np.random.default_rng(seed)
    src = [np.r_[rng.integers(4, VOCAB, int(k) - 1), 3].tolist() for k in rng.integers(1, 13, n)]
    tgt = [np.r_[rng.integers(4, VOCAB, int(k) - 1), 3].tolist() for k in rng.integers(1, 13, n)]
    return pa.table(
        {
            "src_ids": src,
            "tgt_ids": tgt,
            "src_len": [len(r) for r in src],
            "tgt_len": [len(r) for r in tgt],
        }
    ).cast(SHARD_SCHEMA)


def write_split(folder: Path, n: int = 500, *, ipc: bool = True) -> pa.Table:
    """Parts of 180 rows written from batches of 70: parts and record batches cut mid-batch."""
    table = shard_rows(n, seed=0)
    twins = ipc_folder(str(folder)) if ipc else None
    writer = ParquetShardWriter(folder, SHARD_SCHEMA, rows_per_file=180, ipc_folder=twins)
    for start in range(0, n, 70):
        writer.write(table.slice(start, 70))
    writer.close()
    return table


@pytest.fixture
def split(tmp_path) -> tuple[Path, pa.Table]:
    return tmp_path / "train", write_split(tmp_path / "train")


def test_every_parquet_part_has_an_ipc_twin_with_the_same_rows(split):
    import pyarrow.ipc
    import pyarrow.parquet as pq

    folder, table = split
    parquet = sorted(folder.glob("part-*.parquet"))
    assert [p.name for p in parquet] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert folder.parent / "arrow" / "train" == ipc_folder(str(folder))
    for path in parquet:
        twin = pyarrow.ipc.open_file(folder.parent / "arrow" / "train" / f"{path.stem}.arrow")
        assert twin.read_all().equals(pq.read_table(path))
    assert pq.read_table(folder).equals(table)  # the split folder is still a Parquet dataset


def test_memory_mapped_rows_equal_the_parquet_rows(split):
    folder, table = split
    mapped = TokenData.read(str(folder), VOCAB)
    loaded = TokenData.read_parquet(str(folder))
    assert len(mapped.chunks) > 3  # one per record batch, across three files
    assert len(mapped) == len(loaded) == table.num_rows
    np.testing.assert_array_equal(mapped.src_lens, table["src_len"].to_numpy())
    np.testing.assert_array_equal(mapped.tgt_lens, loaded.tgt_lens)
    rows = np.random.default_rng(1).permutation(table.num_rows)
    src, tgt = mapped.ids(rows)
    assert [s.tolist() for s in src] == [table["src_ids"][int(i)].as_py() for i in rows]
    assert [t.tolist() for t in tgt] == [table["tgt_ids"][int(i)].as_py() for i in rows]
    for a, b in zip(
        mapped.batch(rows[:40], 0, 2, 8), loaded.batch(rows[:40], 0, 2, 8), strict=True
    ):
        assert a.equal(b)


def test_memory_mapped_values_are_views_of_the_files_not_copies(split):
    folder, _ = split
    for values in (c[i] for c in TokenData.read(str(folder), VOCAB).chunks for i in (0, 2)):
        assert not values.flags.owndata and not values.flags.writeable


def test_the_batch_stream_is_the_same_over_either_reading(split):
    folder, _ = split
    streams = [
        BatchStream(data, max_tokens=60, seed=3, epoch=0, index=5)
        for data in (TokenData.read(str(folder), VOCAB), TokenData.read_parquet(str(folder)))
    ]
    a, b = (s.take(150) for s in streams)  # crosses into the next epoch
    assert streams[0].position == streams[1].position and streams[0].epoch >= 1
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_fairseq_batch_stream_repeats_its_batches_each_epoch_and_resumes_at_its_cursor(split):
    folder, _ = split
    data = TokenData.read(str(folder), VOCAB)
    stream = BatchStream(data, max_tokens=60, seed=3, fairseq=True)
    first = stream.take(len(stream._current()))  # epoch 0, whole
    assert stream.position == {"epoch": 0, "index": len(first)}
    second = stream.take(len(first))  # epoch 1: the same batches, another order
    assert {tuple(b) for b in first} == {tuple(b) for b in second}
    assert [tuple(b) for b in first] != [tuple(b) for b in second]
    resumed = stream.at(1, 3).take(5)
    assert all(np.array_equal(x, y) for x, y in zip(resumed, second[3:8], strict=True))


def test_a_folder_without_ipc_files_is_read_from_parquet_with_one_warning(tmp_path, caplog):
    folder = tmp_path / "train"
    table = write_split(folder, ipc=False)
    assert token_files(str(folder)) is None
    with caplog.at_level(logging.WARNING, logger="training.data"):
        data = TokenData.read(str(folder), VOCAB)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tfm stage shard" in warnings[0] and "--force" in warnings[0]
    assert len(data.chunks) == 1 and data.chunks[0][0].dtype == np.uint16
    np.testing.assert_array_equal(data.src_lens, table["src_len"].to_numpy())


def test_a_missing_twin_falls_back_to_parquet(split):
    folder, _ = split
    (ipc_folder(str(folder)) / "part-00001.arrow").unlink()
    assert token_files(str(folder)) is None
    assert len(TokenData.read(str(folder), VOCAB).chunks) == 1


@pytest.mark.parametrize("ipc", [True, False])
def test_ids_past_the_vocabulary_are_an_error_naming_the_folder(tmp_path, ipc):
    folder = tmp_path / "train"
    write_split(folder, ipc=ipc)
    with pytest.raises(ValueError, match=f"{folder}.*>= vocab_size 100"):
        TokenData.read(str(folder), 100)


def test_the_manifest_counts_ipc_rows_and_damage_finds_a_broken_ipc_file(tmp_path):
    def build(tmp: Path) -> dict:
        write_split(tmp / "train")
        return {}

    out = build_folder("shard", tmp_path / "shard", {}, {}, build).path
    manifest = read_manifest(out)
    assert manifest["files"]["arrow/train/part-00001.arrow"]["rows"] == 180
    assert damage(out, manifest) is None
    path = out / "arrow" / "train" / "part-00002.arrow"
    size = path.stat().st_size
    path.write_bytes(b"\0" * size)  # same size: the footer check, not the size check, finds it
    assert damage(out, manifest) == (
        "arrow/train/part-00002.arrow is not a readable Arrow IPC file (its footer does not read)"
    )
