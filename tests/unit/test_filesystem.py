"""The filesystem seam: one way to open a location (a local path, a ``file://`` URL, a URI that
fsspec knows), the same reads through the local and the fsspec implementation, and this node's
copy of a stored folder behind ``StoredFolder.local`` (a local work dir's folder as it is)."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filesystem.location import LocalFileSystem, UriFileSystem, open_location
from filesystem.storage import StoredFolder, folder_at, open_store
from training.data import TokenData, shard_files, token_files


def write_files(location, names: list[str]) -> None:
    location.arrow.create_dir(location.path, recursive=True)
    for name in names:
        with location.arrow.open_output_stream(f"{location.path}/{name}") as f:
            f.write(name.encode())


@pytest.fixture
def memory():
    """A fresh folder of fsspec's in-process memory filesystem."""
    return open_location(f"memory://seam-{uuid.uuid4().hex}/split")


def test_a_local_path_opens_on_this_nodes_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    location = open_location("runs/x")
    assert isinstance(location.filesystem, LocalFileSystem)
    assert location.path == location.name == str(tmp_path / "runs" / "x")
    assert location.local() == tmp_path / "runs" / "x"
    assert location.child("best/model.pt").path == str(tmp_path / "runs/x/best/model.pt")


def test_a_file_url_is_this_nodes_disk_under_its_own_name(tmp_path):
    url = f"file://{tmp_path}/a/../b"
    location = open_location(url)
    assert isinstance(location.filesystem, LocalFileSystem)
    assert (location.path, location.name) == (str(tmp_path / "b"), url)
    assert location.local() == tmp_path / "b"


def test_local_and_fsspec_locations_list_the_same_files(tmp_path, memory):
    names = ["part-00001.parquet", "part-00000.parquet", "notes.txt"]
    local = open_location(tmp_path / "split")
    for location in (local, memory):
        write_files(location, names)
        write_files(location.child("sub"), ["inner.txt"])  # a folder's own files only
    assert isinstance(memory.filesystem, UriFileSystem)
    assert [Path(p).name for p in local.files()] == sorted(names)
    assert [Path(p).name for p in memory.files()] == sorted(names)
    assert memory.local() is None
    assert open_location(tmp_path / "absent").files() == []


def test_a_location_survives_pickling_as_ray_hands_it_on(tmp_path, memory):
    write_files(memory, ["a.txt"])
    for location in (open_location(tmp_path), memory):
        back = pickle.loads(pickle.dumps(location))
        assert (back.path, back.name) == (location.path, location.name)
        assert back.files() == location.files()


def test_a_split_off_this_nodes_disk_is_read_from_parquet_not_mapped(tmp_path, memory):
    """``training.data`` asks the location, not the path's scheme: the same split trains from a
    local folder (memory-mapped twins absent: Parquet) and from fsspec's memory filesystem."""
    table = pa.table(
        {
            "src_ids": pa.array([[5, 3], [6, 7, 3]], pa.list_(pa.int32())),
            "tgt_ids": pa.array([[8, 3], [9, 3]], pa.list_(pa.int32())),
        }
    )
    local = open_location(tmp_path / "train")
    for location in (local, memory):
        location.arrow.create_dir(location.path, recursive=True)
        pq.write_table(table, f"{location.path}/part-00000.parquet", filesystem=location.arrow)
    assert [Path(f).name for f in shard_files(memory.name)] == ["part-00000.parquet"]
    assert token_files(memory.name) is None  # no memory map off this node's disk
    read = [TokenData.read(where, vocab_size=10) for where in (local.path, memory.name)]
    for data in read:
        assert data.src_lens.tolist() == [2, 3] and data.tgt_lens.tolist() == [2, 2]
    src, tgt = read[1].ids([1])
    np.testing.assert_array_equal(src[0], [6, 7, 3])
    np.testing.assert_array_equal(tgt[0], [9, 3])


def test_a_local_work_dirs_folder_is_read_where_it_is(tmp_path):
    (tmp_path / "shard").mkdir()
    folder = folder_at(tmp_path / "shard")
    assert isinstance(folder, StoredFolder)
    assert folder.local() == tmp_path / "shard"
    assert pickle.loads(pickle.dumps(folder)).local() == tmp_path / "shard"
    (tmp_path / "shard" / "a.bin").write_bytes(b"abc")
    with folder.open_input_file("a.bin") as f:
        assert f.read() == b"abc"


def test_a_local_stores_location_is_on_this_nodes_disk(tmp_path):
    location = open_store(tmp_path).location("train_ray")
    assert isinstance(location.filesystem, LocalFileSystem)
    assert location.path == location.name == str(tmp_path / "train_ray")
