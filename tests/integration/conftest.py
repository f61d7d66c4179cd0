"""Fixtures the integration tests share: one local Ray and one Prefect test harness per session.

Both are expensive to start (Ray ~5 s, the harness ~14 s), so every module uses the same ones;
stages that find Ray running reuse it (``tasks.framework.runtime.ensure_ray``).
"""

from __future__ import annotations

import pytest
from helpers.mlflow_server import MlflowServer
from helpers.ray_cluster import start_local_ray
from helpers.stage_folders import finished_folder, tiny_sentences, tokenizer_folder


@pytest.fixture(scope="session")
def ray_local():
    """A local 2-CPU Ray started as a command's stages start it (``ensure_ray``, with the
    switches ``tfm`` sets), shut down at the end."""
    import ray

    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture
def server(mirror_root):
    """A local HTTP mirror (helpers.mirror.MirrorServer) serving the requesting module's
    ``mirror_root`` folder."""
    from helpers.mirror import MirrorServer

    srv = MirrorServer(mirror_root)
    yield srv
    srv.close()


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 (SQLite under ``tmp_path``), killed at the end."""
    srv = MlflowServer(tmp_path / "server")
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture(scope="session")
def harness():
    """Prefect's test harness: a temporary API server and database for the session's flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


# ----------------------------------------------------------------------------- a tiny trained model


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A tokenizer stage folder: a 64-piece sentencepiece BPE model (pad 0, unk 1, bos 2, eos 3)."""
    return tokenizer_folder(
        tmp_path_factory.mktemp("tiny") / "tokenizer", tiny_sentences(300, seed=0), 64
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tiny_tokenizer):
    """An average stage folder (chained to a train folder, for lineage) with a debug-size model
    trained for 200 steps to copy its input, so that its outputs depend on the content."""
    import torch

    from serving.tokenizer import load
    from transformer_core import checkpoint, presets
    from transformer_core.model import Transformer
    from transformer_core.schedule import make_optimizer, make_scheduler

    root = tmp_path_factory.mktemp("tiny-model")
    tok = load(tiny_tokenizer)
    data = [tok.encode(s) for s in tiny_sentences(200, seed=5)]

    def build(tmp):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model on a shared machine: extra threads only wait
        try:
            torch.manual_seed(0)
            model = Transformer(presets.debug(), tok.vocab_size).train()
            # The paper's optimizer and schedule: warmup to 3.95e-3 at step 40 (d_model 64).
            opt = make_optimizer(model)
            schedule = make_scheduler(opt, d_model=64, warmup_steps=40, scale=0.2)
            for step in range(200):
                batch = [data[(step * 16 + i) % len(data)] for i in range(16)]
                tgt = torch.zeros(16, max(map(len, batch)), dtype=torch.long)  # (B, T), pad 0
                for i, ids in enumerate(batch):
                    tgt[i, : len(ids)] = torch.tensor(ids)
                tgt_in = torch.cat([torch.full((16, 1), 2), tgt[:, :-1]], dim=1).masked_fill(
                    tgt.eq(0), 0
                )
                logits = model(tgt, tgt_in)  # source = target: a copy task
                loss = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), tgt.flatten(), ignore_index=0
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                schedule.step()
        finally:
            torch.set_num_threads(threads)
        checkpoint.save(tmp / "model.pt", model, presets.debug(), vocab_size=tok.vocab_size)
        return {"loss": loss.item()}

    train = finished_folder(root / "train", "train", {"steps": 200}, lambda tmp: {})
    return finished_folder(root / "average", "average", {"copy": 200}, build, {"train": train})


# ----------------------------------------------------------------------------- object storage


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS, ``s3_server.SeaweedS3``) on loopback for the session."""
    from helpers.s3_server import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.close()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The server's keys and endpoint in the standard environment variables, for this test."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server
