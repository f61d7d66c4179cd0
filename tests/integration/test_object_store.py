"""The work dir's store layer (filesystem.storage) against a real S3 server (SeaweedFS on loopback):
Ray Data's Parquet straight to and from the bucket, bad settings in one line, manifest-last
publishing, and the per-node copy training reads."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from helpers.s3_server import BUCKET, free_ports

from filesystem.storage import StorageError, StoreSettings, node_copy, open_store
from tasks.framework.manifest import MANIFEST, describe_files

pytestmark = pytest.mark.integration


def _prefix() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


def _stage_folder(root: Path, rows: int = 50) -> Path:
    """A finished stage folder as the runner leaves it: files, then a manifest listing them."""
    folder = root / "out"
    (folder / "parts").mkdir(parents=True)
    (folder / "parts" / "a.txt").write_text("".join(f"line {i}\n" for i in range(rows)))
    (folder / "b.bin").write_bytes(bytes(range(256)) * 4)
    manifest = {"stage": "demo", "fingerprint": uuid.uuid4().hex, "files": describe_files(folder)}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.slow  # Ray Data's Parquet on the S3 server: ~12 s
def test_ray_data_writes_and_reads_parquet_on_the_bucket(s3_env, ray_local):
    import ray

    store = open_store(_prefix())
    store.check()
    rows = [{"id": i, "text": f"sentence {i}"} for i in range(1_000)]
    ray.data.from_items(rows).repartition(3).write_parquet(
        store.path("shard/train"), filesystem=store.filesystem
    )
    files = store.filesystem.get_file_info(pafs.FileSelector(store.path("shard/train")))
    assert len([f for f in files if f.path.endswith(".parquet")]) == 3
    back = ray.data.read_parquet(store.path("shard/train"), filesystem=store.filesystem)
    assert sorted(back.take_all(), key=lambda r: r["id"]) == rows


def test_bad_store_settings_fail_in_one_line_and_write_nothing(s3_env, monkeypatch):
    secret = s3_env.secret_key
    cases = {
        "does not exist": (f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/run", StoreSettings()),
        "refused the credentials in $TFM_KEY and $TFM_SECRET": (
            _prefix(),
            StoreSettings(access_key_env="TFM_KEY", secret_key_env="TFM_SECRET"),
        ),
        "does not answer": (
            _prefix(),
            StoreSettings(endpoint=f"http://127.0.0.1:{free_ports(1)[0]}", timeout_seconds=2),
        ),
    }
    monkeypatch.setenv("TFM_KEY", s3_env.access_key)
    monkeypatch.setenv("TFM_SECRET", "not-" + secret)
    before = s3_env.filesystem().get_file_info(pafs.FileSelector(BUCKET, recursive=True))
    for what, (uri, settings) in cases.items():
        with pytest.raises(StorageError) as err:
            open_store(uri, settings).check()
        message = str(err.value)
        assert what in message and uri in message, message
        assert "\n" not in message and secret not in message
    after = s3_env.filesystem().get_file_info(pafs.FileSelector(BUCKET, recursive=True))
    assert [f.path for f in after] == [f.path for f in before]


def test_unset_credential_variables_and_uris_with_secrets_are_refused(s3_env):
    with pytest.raises(StorageError, match=r"\$NOT_SET_ANYWHERE .* is not set"):
        open_store(_prefix(), StoreSettings(access_key_env="NOT_SET_ANYWHERE"))
    with pytest.raises(StorageError, match="holds credentials") as err:
        open_store(f"s3://key:{s3_env.secret_key}@{BUCKET}/run")
    assert s3_env.secret_key not in str(err.value)


def test_a_folder_is_complete_only_once_its_manifest_is_written_last(s3_env, tmp_path):
    store = open_store(_prefix())
    local = _stage_folder(tmp_path)
    fs = store.filesystem
    # A dead run: some files up, no manifest; then one with a manifest but a short file.
    fs.create_dir(store.path("stage/parts"))
    with fs.open_output_stream(store.path("stage/parts/a.txt")) as f:
        f.write(b"line 0\n")
    with fs.open_output_stream(store.path("stage/stray.tmp")) as f:
        f.write(b"left by a dead run")
    with fs.open_output_stream(store.path("stage/b.bin")) as f:
        f.write((local / "b.bin").read_bytes())
    assert store.missing("stage").endswith("stage has no manifest")
    with fs.open_output_stream(store.path(f"stage/{MANIFEST}")) as f:
        f.write((local / MANIFEST).read_bytes())
    assert "parts/a.txt has 7 bytes, manifest says" in store.missing("stage")

    store.publish(local, "stage")
    assert store.missing("stage") is None
    names = {
        i.path.removeprefix(store.path("stage") + "/")
        for i in fs.get_file_info(pafs.FileSelector(store.path("stage"), recursive=True))
        if i.type == pafs.FileType.File
    }
    assert names == {"parts/a.txt", "b.bin", MANIFEST}  # the dead run's stray file is gone
    assert store.read_manifest("stage") == json.loads((local / MANIFEST).read_text())


_COPY = """
import sys
from pathlib import Path
from filesystem.storage import node_copy, open_store
print(node_copy(open_store(sys.argv[1]), "stage", Path(sys.argv[2])))
"""


def test_the_node_copy_is_made_once_checked_and_shared(s3_env, tmp_path):
    store = open_store(_prefix())
    local = _stage_folder(tmp_path / "src", rows=20_000)
    store.publish(local, "stage")
    cache = tmp_path / "node-cache"
    # Three workers of one node ask at once: one fills the cache, the others wait and reuse it.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COPY, store.uri, str(cache)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    copy = Path(outs[0])
    assert (copy / "parts" / "a.txt").read_bytes() == (local / "parts" / "a.txt").read_bytes()
    assert [p.name for p in copy.parent.iterdir() if p.is_dir()] == [copy.name]  # one copy
    inode = (copy / "b.bin").stat().st_ino
    assert node_copy(store, "stage", cache) == copy and (copy / "b.bin").stat().st_ino == inode

    # The same sizes, other bytes: a fresh node's copy is refused by the manifest's sha256.
    with store.filesystem.open_output_stream(store.path("stage/b.bin")) as f:
        f.write(bytes(reversed(range(256))) * 4)
    with pytest.raises(StorageError, match=r"stage/b.bin does not match its manifest's sha256"):
        node_copy(store, "stage", tmp_path / "other-node")
    assert not any((tmp_path / "other-node").rglob("b.bin"))  # no half copy left behind
