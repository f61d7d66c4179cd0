"""The train and average stages on real Ray Train (2 CPU workers) and MLflow (SQLite).

The data is a tiny reversal task (vocabulary 20) written as real stage folders, so manifests
and fingerprints are real (``helpers.tiny_training``, which the resume, multi-node and elastic
tests share).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.sockets import loopback
from helpers.tiny_training import (
    VOCAB,
    make_inputs,
    make_shards,
    make_tokenizer,
    metric_history,
    tiny_config,
    write_split,
)

from tasks.framework import stage_fingerprint
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import build_folder, run_stage

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained_and_sockets(ray_local, tmp_path_factory):
    """The run, and every listening socket of every process of this test session while it ran
    (its Ray, the workers' torch store and gloo pairs), seen from the main thread."""
    import psutil

    root = tmp_path_factory.mktemp("train")
    inputs = make_inputs(root)
    config = tiny_config(root, bleu_sentences=24)
    outcome: list = []
    checked: list[str] = []  # the input folders whose fingerprint (and damage) was checked
    check = stage_fingerprint.input_fingerprint

    def counted(folder: Path, name: str) -> str:
        checked.append(name)
        return check(folder, name)

    patch = pytest.MonkeyPatch()
    patch.setattr(stage_fingerprint, "input_fingerprint", counted)
    thread = threading.Thread(
        target=lambda: outcome.append(_attempt(run_stage, config, "train", inputs))
    )
    thread.start()
    me, sockets = psutil.Process(), set()
    while thread.is_alive():
        tree = {me.pid, *(p.pid for p in me.children(recursive=True))}
        # One pass over the machine's sockets (per-process calls re-read the tables each time).
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.pid in tree:
                try:
                    name = psutil.Process(conn.pid).name()
                except psutil.NoSuchProcess:
                    continue
                sockets.add((name, conn.laddr.ip, conn.laddr.port))
        time.sleep(0.2)
    thread.join()
    patch.undo()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    # The stage checks each input once: its identity and Ray's run folder share the fingerprints.
    assert sorted(checked) == ["shard", "tokenizer"], checked
    return (config, inputs, result.path), sockets


def _attempt(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - re-raised by the fixture, in the test's thread
        return exc


@pytest.fixture(scope="module")
def trained(trained_and_sockets):
    return trained_and_sockets[0]


def test_a_training_run_listens_on_loopback_only(trained_and_sockets):
    """Every listening socket of the 2-worker run is on 127.0.0.1, the torch store's included
    (it listened on every interface before it was bound to the node's address)."""
    sockets = trained_and_sockets[1]
    workers = [s for s in sockets if s[0].startswith("ray::RayTrainWo")]
    # The process group was up while we looked: rank 0's store and gloo's pairs listen on
    # ports of their own, outside Ray's worker port range (the workers' gRPC servers).
    assert [s for s in workers if not 10002 <= s[2] <= 19999], workers
    exposed = [s for s in sockets if not loopback(s[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_two_workers_learn_and_log_to_mlflow(trained):
    from mlflow.tracking import MlflowClient

    from transformer_core import checkpoint

    config, _, out = trained
    manifest = read_manifest(out)
    stats = manifest["stats"]
    assert stats["world_size"] == 2 and stats["complete"] and stats["step"] == 24
    # The node's cores shared between its two workers, for intra- and inter-op threads alike.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert (stats["torch_threads"], stats["torch_interop_threads"]) == (share, share)
    # The workers started with glibc told to keep freed memory (train.keep_freed_memory).
    assert stats["keep_freed_memory"] is True

    losses = metric_history(config, stats["mlflow_run_id"], "loss")
    assert sorted(losses) == list(range(1, 25))
    first, last = (
        np.mean([losses[s] for s in (1, 2, 3)]),
        np.mean([losses[s] for s in (22, 23, 24)]),
    )
    assert last < first - 0.3, (first, last)
    val = metric_history(config, stats["mlflow_run_id"], "val_loss")
    # 24 steps of the debug model learn the reversal task's piece frequencies, not yet the
    # reversal: every validation beats the untrained model's loss (the first steps' loss).
    assert sorted(val) == [8, 16, 24] and max(val.values()) < first - 0.2, (val, first)

    run = MlflowClient(config.tracking_uri).get_run(stats["mlflow_run_id"])
    params = run.data.params
    assert params["train.num_workers"] == "2"
    assert params["model.d_model"] == "64"
    assert params["world_size"] == "2"
    assert int(params["n_parameters"]) > 0
    for key in ("lr", "ppl", "grad_norm", "tokens_per_s", "memory_gb"):
        assert key in run.data.metrics, key

    listing = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    assert [c["step"] for c in listing] == [6, 12, 18, 24]
    times = [c["time"] for c in listing]
    assert times == sorted(times)
    for c in listing:
        data = checkpoint.load(out / c["path"])
        assert data["vocab_size"] == VOCAB and data["step"] == c["step"]
    final = checkpoint.load_model(out / "final" / "model.pt")
    last_ckpt = checkpoint.load(out / listing[-1]["path"])["model"]
    for k, v in final.state_dict().items():
        assert np.array_equal(v.numpy(), last_ckpt[k].numpy()), k
    assert (out / "learning_curve.png").stat().st_size > 0


def test_dev_bleu_is_logged_and_the_best_checkpoint_kept(trained):
    from transformer_core import checkpoint

    config, _, out = trained
    stats = read_manifest(out)["stats"]
    bleu = metric_history(config, stats["mlflow_run_id"], "val_bleu")
    assert sorted(bleu) == [8, 16, 24] and all(0.0 <= b <= 100.0 for b in bleu.values())
    best_step = max(bleu, key=lambda s: (bleu[s], -s))  # the first of equals is kept
    best = json.loads((out / "checkpoints.json").read_text())["best"]
    assert best["step"] == best_step == stats["best_step"]
    assert best["val_bleu"] == pytest.approx(bleu[best_step])
    state = checkpoint.load(out / best["path"])
    assert state["step"] == best_step and state["vocab_size"] == VOCAB
    if best_step == 24:  # the same weights as the last checkpoint
        last = checkpoint.load(out / "final" / "model.pt")["model"]
        assert all(np.array_equal(v.numpy(), last[k].numpy()) for k, v in state["model"].items())


def test_up_to_date_stage_is_skipped(trained):

    config, inputs, out = trained
    before = read_manifest(out)["started"]
    result = run_stage(config, "train", inputs)
    assert result.path == out and not result.ran
    assert read_manifest(out)["started"] == before


def test_average_stage_means_the_last_checkpoints(trained):
    import torch

    from transformer_core import checkpoint

    config, _, train_out = trained
    config = config.replace(average=config.average.__class__(last=3, spacing="step"))
    out = run_stage(config, "average", {"train": train_out}).path
    manifest = read_manifest(out)
    assert manifest["stats"]["steps"] == [12, 18, 24]
    averaged = checkpoint.load(out / "model.pt")
    sources = [
        checkpoint.load(train_out / f"checkpoints/step-{s:09d}/model.pt") for s in (12, 18, 24)
    ]
    for key, value in averaged["model"].items():
        expected = torch.stack([s["model"][key].float() for s in sources]).mean(0)
        torch.testing.assert_close(value.float(), expected)
    model = checkpoint.load_model(out / "model.pt")  # what translate and register read
    assert model.src_vocab_size == VOCAB


def test_average_with_too_few_checkpoints_warns(trained):

    config, _, train_out = trained
    config = config.replace(average=config.average.__class__(last=50, spacing="step"))
    out = run_stage(config, "average", {"train": train_out}).path
    stats = read_manifest(out)["stats"]
    assert stats["count"] == 4 and stats["requested"] == 50 and "warning" in stats


def test_average_select_best_takes_the_best_checkpoint_by_dev_bleu(trained, tmp_path):
    from transformer_core import checkpoint

    config, _, train_out = trained
    best = json.loads((train_out / "checkpoints.json").read_text())["best"]
    picked = config.replace(workdir=str(tmp_path), average=config.average.__class__(select="best"))
    out = run_stage(picked, "average", {"train": train_out}).path
    stats = read_manifest(out)["stats"]
    assert stats["steps"] == [best["step"]] and stats["val_bleu"] == best["val_bleu"]
    chosen = checkpoint.load(out / "model.pt")["model"]
    kept = checkpoint.load(train_out / best["path"])["model"]
    assert all(np.array_equal(v.numpy(), kept[k].numpy()) for k, v in chosen.items())

    listing = json.loads((train_out / "checkpoints.json").read_text())
    del listing["best"]

    def build(tmp: Path) -> dict:  # a train stage that measured no dev BLEU
        (tmp / "checkpoints.json").write_text(json.dumps(listing))
        return {}

    no_bleu = build_folder("train", tmp_path / "no_bleu", {"fake": True}, {}, build).path
    with pytest.raises(StageError, match="average.select: best.*bleu_sentences"):
        run_stage(picked.replace(workdir=str(tmp_path / "other")), "average", {"train": no_bleu})


# ----------------------------------------------------------------------------- bad input


def test_missing_shards_error(ray_local, tmp_path):

    inputs = make_inputs(tmp_path)
    for f in (inputs["shard"] / "train").iterdir():
        f.unlink()
    # The stage contract finds the damage before the stage looks: files its manifest lists.
    with pytest.raises(
        StageError, match=r"input 'shard' in .* is damaged: train/part-00000.parquet is missing"
    ):
        run_stage(tiny_config(tmp_path), "train", inputs)


def test_missing_input_folder_error(ray_local, tmp_path):

    inputs = {"shard": tmp_path / "nope", "tokenizer": make_tokenizer(tmp_path)}
    with pytest.raises(StageError, match="'shard' is missing"):
        run_stage(tiny_config(tmp_path), "train", inputs)


def test_empty_shards_error(ray_local, tmp_path):

    def build(tmp: Path) -> dict:
        write_split(tmp / "train", 0, seed=1, parts=1)
        write_split(tmp / "dev", 4, seed=2, parts=1)
        return {}

    shard = build_folder("shard", tmp_path / "shard", {"empty": True}, {}, build).path
    inputs = {"shard": shard, "tokenizer": make_tokenizer(tmp_path)}
    with pytest.raises(StageError, match="0 rows"):
        run_stage(tiny_config(tmp_path), "train", inputs)


def test_vocabulary_mismatch_errors(ray_local, tmp_path):

    inputs = make_inputs(tmp_path)
    config = tiny_config(tmp_path)
    wrong = config.replace(tokenizer=config.tokenizer.__class__(vocab_size=32))
    with pytest.raises(StageError, match="tokenizer.vocab_size"):
        run_stage(wrong, "train", inputs)
    other = tmp_path / "other"
    inputs["shard"] = make_shards(other, stats={"vocab_size": 37})
    with pytest.raises(StageError, match="vocab_size 37"):
        run_stage(config, "train", inputs)


def test_rows_longer_than_the_model_or_budget_are_refused_before_ray_train(ray_local, tmp_path):

    tokenizer = make_tokenizer(tmp_path)

    def manifest_says(longest: int) -> dict:  # the shard manifest's lengths: one long target row
        return {
            "vocab_size": VOCAB,
            "train": {"max_src_len": 9, "max_tgt_len": longest},
            "dev": {"max_src_len": 9, "max_tgt_len": 9},
        }

    inputs = {
        "shard": make_shards(tmp_path / "a", stats=manifest_says(600)),
        "tokenizer": tokenizer,
    }
    with pytest.raises(
        StageError, match=r"shard/train holds a row of 600 pieces but model.max_len is 512"
    ):
        run_stage(
            tiny_config(tmp_path, max_tokens_per_batch=1024), "train", inputs
        )  # debug: max_len 512
    inputs["shard"] = make_shards(tmp_path / "b", stats=manifest_says(200))
    with pytest.raises(
        StageError, match=r"train.max_tokens_per_batch is 128: rerun `tfm stage shard --config"
    ):
        run_stage(tiny_config(tmp_path), "train", inputs)
    # no manifest lengths: the shards' own Parquet statistics (rows of up to 9 pieces here)
    inputs["shard"] = make_shards(tmp_path / "c")
    with pytest.raises(
        StageError, match=r"shard/train holds a row of 9 pieces .* train.max_tokens_per_batch is 8"
    ):
        run_stage(tiny_config(tmp_path, max_tokens_per_batch=8), "train", inputs)
    assert not (tmp_path / "train_ray").exists() and not (tmp_path / "train").exists()


def test_gpu_requested_without_gpu_errors(ray_local, tmp_path):
    import ray

    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this machine has a GPU")
    with pytest.raises(StageError, match="train.use_gpu"):
        run_stage(tiny_config(tmp_path, use_gpu=True), "train", make_inputs(tmp_path))


def test_average_without_checkpoints_errors(tmp_path):

    def build(tmp: Path) -> dict:
        (tmp / "checkpoints.json").write_text(json.dumps({"checkpoints": []}))
        return {}

    train_out = build_folder("train", tmp_path / "train", {"fake": True}, {}, build).path
    config = tiny_config(tmp_path)
    with pytest.raises(StageError, match="no checkpoints"):
        run_stage(config, "average", {"train": train_out})


@pytest.mark.slow  # one more Ray Train run
def test_progress_lines_and_the_collapse_warning_reach_the_console(
    ray_local, tmp_path, capfd, monkeypatch
):
    import time

    import ray._private.ray_logging as ray_logging
    from mlflow.tracking import MlflowClient

    # A spread floor no encoder can reach: every validation warns.
    config = tiny_config(
        tmp_path,
        steps=6,
        num_workers=1,
        cpus_per_worker=1.0,
        log_every=2,
        eval_every=3,
        warn_encoder_spread=2.0,
    )
    # Ray's driver holds back a worker's line whose words without digits match another
    # process's line of the last few seconds ("[repeated 2x across cluster]"): an earlier test's
    # progress lines read so, and this run's first one was held back (two CI replicas, once
    # after waiting out the window). The driver's deduplicator reads this flag at each batch.
    monkeypatch.setattr(ray_logging, "RAY_DEDUP_LOGS", False)
    capfd.readouterr()  # what earlier tests printed
    run_stage(config, "train", make_inputs(tmp_path))
    out = ""
    for _ in range(30):  # Ray forwards worker output to the driver asynchronously
        out += "".join(capfd.readouterr())
        if "train step 6/6" in out and out.count("WARNING step") >= 2:
            break
        time.sleep(0.5)
    # This run's lines (of 6 steps): Ray forwards workers' output late, an earlier test's too
    lines = [line for line in out.splitlines() if "train step" in line and "/6 (" in line]
    assert [line.split("train step ")[1].split(" ")[0] for line in lines] == ["2/6", "4/6", "6/6"]
    assert all("ETA" in line and "tgt tok/s" in line for line in lines)
    assert out.count("WARNING step") == 2 and "val_encoder_spread" in out
    # Ray Train's own INFO lines at every checkpoint are dropped (checkpoints.json has them).
    assert "Reporting training result" not in out and "Checkpoint successfully" not in out
    client = MlflowClient(config.tracking_uri)
    run = client.search_runs([client.get_experiment_by_name("transformer").experiment_id])[0]
    ppl = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_ppl")}
    assert f"dev ppl {ppl[3]:.2f}" in lines[1]  # step 4: the validation at step 3
    assert f"dev ppl {ppl[6]:.2f}" in lines[-1]  # the last line: the last validation's
    assert run.data.tags["warning.encoder_collapse"].startswith("step 6: spread ")
