"""The stage contract: manifests, fingerprints, skipping, forcing, atomic publication."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.framework.freshness import check
from tasks.framework.manifest import MANIFEST, read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import build_folder
from tasks.framework.stage_fingerprint import input_fingerprint, stage_fingerprint, stage_identity
from transformer_core.folders import sha256_file


def _writer(calls: list[str], text: str = "hello\n"):
    def build(tmp: Path) -> dict:
        calls.append(str(tmp))
        (tmp / "sub").mkdir()
        (tmp / "out.txt").write_text(text)
        (tmp / "sub" / "more.txt").write_text("x")
        return {"rows": 2}

    return build


def test_run_writes_manifest_with_files_and_stats(tmp_path: Path):
    calls: list[str] = []
    result = build_folder("demo", tmp_path / "demo", {"k": 1}, {}, _writer(calls))
    out = result.path
    assert (result.stage, out, result.ran, result.stats) == (
        "demo",
        tmp_path / "demo",
        True,
        {"rows": 2},
    )
    assert result.reason == f"{out} does not exist"
    manifest = read_manifest(out)
    assert manifest["stage"] == "demo"
    assert manifest["config"] == {"k": 1}
    assert manifest["stats"] == {"rows": 2}
    assert set(manifest["files"]) == {"out.txt", "sub/more.txt"}
    assert manifest["files"]["out.txt"] == {"bytes": 6, "sha256": sha256_file(out / "out.txt")}
    assert manifest["fingerprint"] == stage_fingerprint("demo", {"k": 1}, {})
    # Nothing temporary is left beside the output.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_rerun_skips_and_force_reruns(tmp_path: Path):
    calls: list[str] = []
    out = build_folder("demo", tmp_path / "demo", {"k": 1}, {}, _writer(calls)).path
    first = read_manifest(out)["started"]
    skipped = build_folder("demo", tmp_path / "demo", {"k": 1}, {}, _writer(calls))
    assert len(calls) == 1 and read_manifest(out)["started"] == first
    # A skipped stage still reports the stats its output holds, and why it was skipped.
    assert not skipped.ran and skipped.stats == {"rows": 2} and "matches" in skipped.reason
    forced = build_folder("demo", tmp_path / "demo", {"k": 1}, {}, _writer(calls), force=True)
    assert len(calls) == 2 and forced.ran and forced.reason == "forced"
    changed = build_folder("demo", tmp_path / "demo", {"k": 2}, {}, _writer(calls))
    assert len(calls) == 3 and changed.ran and changed.reason == "config changed (k)"


def test_outdated_hook_reruns_an_up_to_date_output(tmp_path: Path):
    calls: list[str] = []
    build_folder("demo", tmp_path / "demo", {}, {}, _writer(calls))
    kept = build_folder(
        "demo", tmp_path / "demo", {}, {}, _writer(calls), outdated=lambda out: None
    )
    assert not kept.ran and len(calls) == 1
    gone = build_folder(
        "demo", tmp_path / "demo", {}, {}, _writer(calls), outdated=lambda out: "version gone"
    )
    assert gone.ran and gone.reason == "version gone" and len(calls) == 2


def test_changed_or_missing_file_makes_the_stage_stale(tmp_path: Path):
    calls: list[str] = []
    out = build_folder("demo", tmp_path / "demo", {}, {}, _writer(calls)).path
    fp = stage_identity("demo", {}, {})
    assert check(out, fp).up_to_date
    (out / "out.txt").write_text("truncated")
    assert check(out, fp).state == "stale"
    (out / "out.txt").unlink()
    assert "out.txt is missing" in check(out, fp).reason
    build_folder("demo", out, {}, {}, _writer(calls))
    assert len(calls) == 2 and check(out, fp).up_to_date
    assert check(tmp_path / "other", fp).state == "missing"


def test_a_failing_build_leaves_nothing_that_looks_complete(tmp_path: Path):
    def build(tmp: Path) -> dict:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_folder("demo", tmp_path / "demo", {}, {}, build)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_rerun_keeps_the_previous_output(tmp_path: Path):
    out = build_folder("demo", tmp_path / "demo", {"k": 1}, {}, _writer([])).path

    def broken(tmp: Path) -> dict:
        raise ValueError("bad row")

    with pytest.raises(ValueError):
        build_folder("demo", out, {"k": 2}, {}, broken)
    assert (out / "out.txt").read_text() == "hello\n"
    assert read_manifest(out)["config"] == {"k": 1}


def test_inputs_are_fingerprinted_and_must_exist(tmp_path: Path):
    up = build_folder("up", tmp_path / "up", {"v": 1}, {}, _writer([])).path
    calls: list[str] = []
    down = build_folder("down", tmp_path / "down", {}, {"up": up}, _writer(calls)).path
    manifest = read_manifest(down)
    assert manifest["inputs"]["up"]["fingerprint"] == input_fingerprint(up, "up")
    # A changed upstream changes the downstream fingerprint: it reruns.
    build_folder("up", up, {"v": 2}, {}, _writer([]))
    build_folder("down", down, {}, {"up": up}, _writer(calls))
    assert len(calls) == 2
    with pytest.raises(StageError, match="input 'nothing' is missing"):
        build_folder("down", tmp_path / "d2", {}, {"nothing": tmp_path / "absent"}, _writer([]))


def test_manifest_is_valid_json_and_written_last(tmp_path: Path):
    seen: dict[str, bool] = {}

    def build(tmp: Path) -> dict:
        (tmp / "a").write_text("a")
        seen["manifest_during_build"] = (tmp / MANIFEST).exists()
        return {}

    out = build_folder("demo", tmp_path / "demo", {}, {}, build).path
    assert seen["manifest_during_build"] is False
    json.loads((out / MANIFEST).read_text())


def test_damaged_files_are_found_before_anyone_reads_them(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.framework.damage import SMALL_FILE

    def build(tmp: Path) -> dict:
        (tmp / "small.txt").write_text("abcdef")
        (tmp / "big.bin").write_bytes(b"x" * (SMALL_FILE + 1))
        pq.write_table(pa.table({"a": list(range(100))}), tmp / "part-00000.parquet")
        return {}

    up = build_folder("up", tmp_path / "up", {}, {}, build).path
    manifest = read_manifest(up)
    assert manifest["files"]["part-00000.parquet"]["rows"] == 100
    fp = stage_identity("up", {}, {})

    def corrupt(name: str, at: int) -> bytes:
        data = (up / name).read_bytes()
        (up / name).write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])  # same size
        return data

    # A small file is checked by sha256, every time: same size, different bytes, found.
    original = corrupt("small.txt", 2)
    assert check(up, fp).reason == "small.txt differs from the sha256 in manifest.json"
    with pytest.raises(
        StageError, match=r"input 'up' in .* is damaged: small.txt .*tfm stage up .*--force"
    ):
        build_folder("down", tmp_path / "down", {}, {"up": up}, _writer([]))
    (up / "small.txt").write_bytes(original)
    # A big file by size only, unless a full check is asked for (`tfm status --verify`).
    original = corrupt("big.bin", 10)
    assert check(up, fp).up_to_date
    assert "big.bin differs" in check(up, fp, full=True).reason
    (up / "big.bin").write_bytes(original)
    # A Parquet file by its footer and row count.
    original = corrupt(
        "part-00000.parquet", (up / "part-00000.parquet").stat().st_size - 6
    )  # footer
    assert "part-00000.parquet is not a readable Parquet file" in check(up, fp).reason
    (up / "part-00000.parquet").write_bytes(original)
    assert check(up, fp, full=True).up_to_date
    assert build_folder("down", tmp_path / "down", {}, {"up": up}, _writer([])).ran


def test_a_rerun_removes_what_killed_runs_left_behind(tmp_path: Path):
    import os
    import subprocess

    dead = subprocess.Popen(["true"])  # a process that has ended: a killed run's pid
    dead.wait()
    left = [tmp_path / f".demo.tmp-{dead.pid}-0badf00d", tmp_path / ".demo.old-0badf00d"]
    running = tmp_path / f".demo.tmp-{os.getpid()}-0000cafe"  # a run still going: not touched
    for folder in [*left, running]:
        folder.mkdir()
        (folder / "half.txt").write_text("half")
    build_folder("demo", tmp_path / "demo", {}, {}, _writer([]))
    assert not any(p.exists() for p in left) and running.is_dir()


def test_both_work_dirs_stage_in_a_fresh_folder_after_clearing_a_dead_runs(tmp_path: Path):
    """A local work dir stages beside the stage's folder, an object store's under this node's
    ``staging/``: each gets a new empty folder, and what a killed run left there is removed."""
    import subprocess

    from filesystem.storage import open_store
    from tasks.framework.workdir import LocalWorkDir
    from tasks.framework.workdir_store import StoreWorkDir

    dead = subprocess.Popen(["true"])  # a process that has ended: a killed run's pid
    dead.wait()
    local = LocalWorkDir(tmp_path / "local")
    store = StoreWorkDir(open_store(tmp_path / "bucket"), tmp_path / "node")
    for wd, beside in ((local, tmp_path / "local"), (store, tmp_path / "node" / "staging")):
        left = beside / f".demo.tmp-{dead.pid}-0badf00d"
        left.mkdir(parents=True)
        tmp = wd.staging("demo")
        assert tmp.parent == beside and tmp.is_dir() and not any(tmp.iterdir())
        assert tmp.name.startswith(".demo.tmp-") and not left.exists()
