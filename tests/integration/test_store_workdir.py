"""The whole WMT14 flow with its work dir on a real S3 server (SeaweedFS, ``s3_server``).

The tiny synthetic config of test_flow, with ``workdir: s3://tfm/<prefix>/{name}``, MLflow on a
local SQLite file and this node's cache in a folder of its own: every stage runs once, its
folder lands in the bucket manifest-last, training's checkpoints go to the bucket, a rerun skips
every stage, and nothing is written outside the bucket and the node cache.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
import yaml
from helpers.flow_configs import WMT14_STAGES, ran, tiny_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # the whole flow, trained: ~3 min


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def store_run(tmp_path_factory, s3_server, harness, ray_local):
    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.config import load_config

    base = tmp_path_factory.mktemp("store-flow")
    prefix = f"flows/{secrets.token_hex(4)}"
    config = tiny_config(
        base,
        **{
            "mlflow.tracking_uri": f"sqlite:///{base}/mlflow.db",
            "storage.cache_dir": str(base / "node-cache"),
            "storage.endpoint": s3_server.endpoint,
        },
    )
    config["workdir"] = f"s3://tfm/{prefix}/{{name}}"
    path = base / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, s3_server.env[name])
        before = _files(base)
        outcomes = pipeline_flow(config_path=str(path), loaded=Loaded(load_config(path)))
        written = _files(base) - before
        again = pipeline_flow(config_path=str(path))
        yield load_config(path), outcomes, again, written


def test_every_stage_lands_in_the_bucket_and_a_rerun_skips_them_all(store_run):
    config, outcomes, again, _ = store_run
    assert ran(outcomes) == WMT14_STAGES
    store = config.store
    for name in WMT14_STAGES:
        manifest = store.read_manifest(name)
        assert manifest is not None, name
        assert store.missing(name, manifest) is None, name
        assert manifest["inputs"] == {} or all(
            info["path"].startswith(config.workdir + "/") for info in manifest["inputs"].values()
        )
    # The run's weights and Ray Train's checkpoints are objects in the bucket.
    assert store.read_manifest("train")["files"]["final/model.pt"]["bytes"] > 0
    import pyarrow.fs as pafs

    ray_files = store.filesystem.get_file_info(
        pafs.FileSelector(store.path("train_ray"), recursive=True)
    )
    assert any(info.path.endswith("model.pt") for info in ray_files)
    assert [r.stage for r in again] == WMT14_STAGES and ran(again) == []
    assert outcomes[-2].stats["bleu_sacre"] == again[-2].stats["bleu_sacre"]


def test_nothing_is_written_outside_the_bucket_and_the_node_cache(store_run):
    config, _, _, written = store_run
    outside = {f for f in written if not f.startswith("node-cache/") and not f.startswith("mlflow")}
    assert outside == set()
    # No stage's staging folder is left behind, and each stage's node copy is its manifest's.
    assert (
        not any((config.root / "staging").glob("*/*"))
        if (config.root / "staging").exists()
        else True
    )
    for name in ("shard", "tokenizer", "average"):
        manifest = config.store.read_manifest(name)
        copy = config.root / "copies" / manifest["fingerprint"] / name
        assert json.loads((copy / "manifest.json").read_text()) == manifest


def test_status_judges_the_bucket_and_verify_reads_every_byte_back(
    store_run, s3_server, monkeypatch
):
    from tasks.framework import runner

    config, _, _, _ = store_run
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3_server.env[name])
    assert all(st.up_to_date for _, st in runner.status(config)), runner.status(config)
    # Same size, other bytes: only a full check (--verify) reads it back and sees it.
    store, rel = config.store, "tokenizer/spm.vocab"
    with store.filesystem.open_input_stream(store.path(rel)) as f:
        data = f.read()
    with store.filesystem.open_output_stream(store.path(rel)) as f:
        f.write(bytes(reversed(data)))
    try:
        states = dict(runner.status(config))
        assert states["tokenizer"].up_to_date
        verified = dict(runner.status(config, full=True))
        assert not verified["tokenizer"].up_to_date
        assert "spm.vocab differs from the sha256" in verified["tokenizer"].reason
        assert verified["shard"].reason.startswith("waits for tokenizer")
    finally:
        with store.filesystem.open_output_stream(store.path(rel)) as f:
            f.write(data)


def test_accept_on_the_store_keeps_a_folder_for_a_changed_config(store_run, s3_server, monkeypatch):
    import dataclasses

    from tasks.framework import runner

    config, _, _, _ = store_run
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3_server.env[name])
    changed = config.replace(decode=dataclasses.replace(config.decode, beam_size=3))
    before = dict(runner.status(changed))["translate"]
    assert not before.up_to_date and "config changed" in before.reason
    result = runner.accept_stage(changed, "translate")
    assert result.reason.startswith("accepted: config changed")
    assert dict(runner.status(changed))["translate"].up_to_date
    manifest = changed.store.read_manifest("translate")
    assert manifest["accepted"][-1]["changed"] == before.reason
    # The folder keeps the fingerprint it was written with: the original config still stands.
    assert all(st.up_to_date for _, st in runner.status(config))


def test_a_missing_bucket_fails_the_first_stage_in_one_line_and_writes_nothing(
    store_run, s3_server, monkeypatch, tmp_path
):
    from filesystem.storage import StorageError
    from tasks.framework.runner import run_stage

    config, _, _, _ = store_run
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3_server.env[name])
    cache = tmp_path / "cache"
    bad = config.replace(
        workdir="s3://no-such-bucket-here/run",
        storage=config.storage.__class__(endpoint=s3_server.endpoint, cache_dir=str(cache)),
    )
    with pytest.raises(StorageError) as caught:
        run_stage(bad, "download")
    message = str(caught.value)
    assert "\n" not in message and "s3://no-such-bucket-here/run" in message
    assert "does not exist" in message
    assert s3_server.env["AWS_SECRET_ACCESS_KEY"] not in message
    assert not cache.exists() or _files(cache) == set()
    assert os.environ["AWS_ACCESS_KEY_ID"] == s3_server.env["AWS_ACCESS_KEY_ID"]


class StopTheStore:
    """A training callback: at step ``at``, once Ray Train has registered the step-3 checkpoint
    in the bucket (its controller collects the reports every 2 s: a kill before that would leave
    no checkpoint to resume from), kills the S3 server (by pid, from the Ray worker)."""

    def __init__(self, pid: int, at: int, endpoint: str, keys: tuple[str, str], prefix: str):
        self.pid, self.at, self.endpoint, self.keys, self.prefix = pid, at, endpoint, keys, prefix

    def registered(self) -> bool:
        import pyarrow.fs as pafs
        from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

        fs = pafs.S3FileSystem(
            access_key=self.keys[0],
            secret_key=self.keys[1],
            scheme="http",
            endpoint_override=self.endpoint.removeprefix("http://"),
            region="us-east-1",
        )
        for info in fs.get_file_info(
            pafs.FileSelector(self.prefix, recursive=True, allow_not_found=True)
        ):
            if info.path.endswith(CHECKPOINT_MANAGER_SNAPSHOT_FILENAME):
                with fs.open_input_stream(info.path) as f:
                    if b"step-000000003" in f.read():
                        return True
        return False

    def __call__(self, trainer) -> None:
        import signal
        import time

        if trainer.step != self.at or trainer.rank != 0:
            return
        deadline = time.time() + 180
        while not self.registered() and time.time() < deadline:
            time.sleep(0.5)
        os.kill(self.pid, signal.SIGKILL)


def test_a_store_that_goes_away_mid_training_fails_it_in_one_line_and_a_rerun_resumes(
    tmp_path, harness, ray_local, monkeypatch
):
    import sys

    import ray.cloudpickle
    from helpers.s3_server import SeaweedS3

    from pipelines.cli import error_line
    from tasks.framework.config import load_config
    from tasks.framework.results import StageError
    from tasks.framework.runner import run_stage

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import it
    server = SeaweedS3(tmp_path / "s3")
    try:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, server.env[name])
        data = tiny_config(
            tmp_path,
            **{
                "mlflow.tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "storage.cache_dir": str(tmp_path / "cache"),
                "storage.endpoint": server.endpoint,
                "storage.timeout_seconds": 3,
                "train.max_failures": 0,
                "train.steps": 9,
            },
        )
        data["workdir"] = "s3://tfm/outage/{name}"
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
        config = load_config(tmp_path / "c.yaml")
        for name in ("download", "clean", "tokenizer", "shard"):
            run_stage(config, name)
        with pytest.raises(StageError) as caught:
            keys = (server.env["AWS_ACCESS_KEY_ID"], server.env["AWS_SECRET_ACCESS_KEY"])
            stop = StopTheStore(
                server.proc.pid, 5, server.endpoint, keys, "tfm/outage/flowtest/train_ray"
            )
            run_stage(config, "train", callbacks=[stop])
        line = error_line(caught.value)
        assert "stage train failed" in line and "rerun the same config to resume" in line
        assert server.env["AWS_SECRET_ACCESS_KEY"] not in line
        server.proc.wait()
        server.start()  # the same ports, keys and data
        assert config.store.read_manifest("train") is None  # nothing looks complete
        result = run_stage(config, "train")
        assert result.ran and result.stats["step"] == 9 and result.stats["complete"]
        assert result.stats["resumed_from_step"] == 3  # the step-3 checkpoint, from the bucket
        assert config.store.missing("train") is None
    finally:
        server.close()
