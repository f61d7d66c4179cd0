"""The GPU path (bf16 autocast, incremental decoding in bf16, checkpoints across devices,
torch.compile, fused Adam, host-sync-free steps). Skipped without CUDA; run with
``pytest -m gpu tests/gpu``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from training.config import TrainConfig
from training.data import TokenData
from training.trainer import Trainer
from transformer_core import BOS_ID, EOS_ID, PAD_ID, Transformer, presets
from transformer_core import checkpoint as ckpt
from transformer_core.decoding import decode_step, init_state
from transformer_core.loss import label_smoothed_nll

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
V = 1000
CUDA = torch.device("cuda")


def model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(presets.debug().replace(max_len=128, **changes), V)


def batch(B: int = 16, S: int = 23, T: int = 19, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    for i in range(B):  # ragged rows: padding in both sides
        src[i, S - i % 5 :] = PAD_ID
        tgt[i, T - 1 - i % 4] = EOS_ID
        tgt[i, T - i % 4 :] = PAD_ID
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt[:, :-1]], dim=1)
    tgt_in[tgt_in == EOS_ID] = PAD_ID
    return src, tgt_in, tgt


def tokens(n: int, seed: int) -> TokenData:
    rng = np.random.default_rng(seed)
    rows = [
        (
            np.r_[rng.integers(4, V, int(rng.integers(5, 40))), EOS_ID],
            np.r_[rng.integers(4, V, int(rng.integers(5, 40))), EOS_ID],
        )
        for _ in range(n)
    ]
    sides = []
    for k in (0, 1):
        lens = [len(r[k]) for r in rows]
        sides += [
            np.concatenate([r[k] for r in rows]).astype(np.uint16),
            np.r_[0, np.cumsum(lens)].astype(np.int64),
        ]
    return TokenData(*sides)


def gpu_training(**changes) -> TrainConfig:
    """A few 2k-token GPU steps, no validation or checkpoints in the way."""
    settings = {
        "tokens_per_step": 2048,
        "max_tokens_per_batch": 1024,
        "warmup_steps": 10,
        "eval_every": 100,
        "checkpoint_every": 0,
        "checkpoint_minutes": 0,
        "use_gpu": True,
        "pad_multiple": 8,
    }
    return TrainConfig(**{**settings, **changes})


def test_bf16_autocast_loss_is_within_tolerance_of_float32():
    m = model().to(CUDA).train()
    src, tgt_in, tgt_out = (t.to(CUDA) for t in batch())
    losses = []
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(5)  # the same dropout masks
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is not None):
            logits = m(src, tgt_in)
        loss, _, n = label_smoothed_nll(logits, tgt_out, 0.1, PAD_ID)
        losses.append(float(loss / n))
    # bf16 keeps 8 bits of mantissa: per-token loss agrees to about 1% (measured: see docs).
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)


def test_incremental_decoding_in_bf16_equals_the_full_forward_within_bf16_tolerance():
    m = model(seed=2).to(CUDA, torch.bfloat16).eval()
    src, tgt_in, _ = (t.to(CUDA) for t in batch(B=4, S=17, T=12, seed=3))
    with torch.inference_mode():
        full = m(src, tgt_in).float()
        state = init_state(m, m.encode(src))
        steps = [decode_step(m, tgt_in[:, :4], state)]
        steps += [decode_step(m, tgt_in[:, t : t + 1], state) for t in range(4, 12)]
        incremental = torch.cat(steps, dim=1).float()
    real = tgt_in != PAD_ID
    # Same weights, other kernels and summation order in bf16: logits of O(10) agree to ~0.1.
    err = (incremental - full)[real].abs().max().item()
    assert err < 0.15, err
    top = (incremental.argmax(-1) == full.argmax(-1))[real].float().mean().item()
    assert top > 0.97, top


def test_a_checkpoint_saved_on_gpu_loads_on_cpu_with_the_same_logits(tmp_path):
    m = model(seed=4).to(CUDA).eval()
    src, tgt_in, _ = batch(B=3, S=9, T=7, seed=5)
    with torch.no_grad():
        on_gpu = m(src.to(CUDA), tgt_in.to(CUDA)).cpu()
    ckpt.save(tmp_path / "m.pt", m, m.config, vocab_size=V)
    cpu = ckpt.load_model(tmp_path / "m.pt", map_location="cpu")
    assert next(cpu.parameters()).device.type == "cpu"
    with torch.no_grad():
        on_cpu = cpu(src, tgt_in)
    torch.testing.assert_close(on_cpu, on_gpu, atol=1e-4, rtol=1e-4)  # tf32 off by default


def test_compile_on_and_off_give_the_same_loss_on_a_fixed_batch():
    m = model(seed=6, dropout=0.0).to(CUDA).train()
    compiled = torch.compile(m, dynamic=True)
    losses = {}
    for name, forward in (("eager", m), ("compiled", compiled)):
        for B, S, T in ((16, 23, 19), (8, 31, 40)):  # two shapes: one dynamic graph
            src, tgt_in, tgt_out = (t.to(CUDA) for t in batch(B, S, T, seed=B))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = forward(src, tgt_in)
            loss, _, n = label_smoothed_nll(logits, tgt_out, 0.1, PAD_ID)
            losses[name, B] = float(loss / n)
    for B in (16, 8):
        assert losses["compiled", B] == pytest.approx(losses["eager", B], rel=5e-3)


def test_a_training_step_makes_no_host_sync_except_on_logging_steps():
    config = gpu_training(steps=6, log_every=3)
    m = model(seed=7).to(CUDA)
    trainer = Trainer(m, config, tokens(400, 1), tokens(20, 2), seed=1)
    assert trainer.optimizer.defaults["fused"]  # fused Adam by default on a GPU
    trainer.train_step()  # warm-up: lazy initialisations may sync once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert trainer.train_step() == {}  # step 2: not a logging step
    finally:
        torch.cuda.set_sync_debug_mode("default")
    metrics = trainer.train_step()  # step 3 logs (and syncs once)
    assert metrics["tokens_per_s"] > 0 and metrics["tflops_per_worker"] > 0
    trainer.close()


def test_compiled_training_matches_eager_training_over_steps():
    config = gpu_training(steps=4, log_every=1)
    traces = {}
    for compile in ((), ("model",)):
        m = model(seed=8, dropout=0.0).to(CUDA)
        trainer = Trainer(
            m,
            dataclasses.replace(config, compile=compile),
            tokens(300, 3),
            tokens(20, 4),
            seed=2,
        )
        traces[bool(compile)] = [trainer.train_step()["loss"] for _ in range(4)]
        trainer.close()
    assert traces[True] == pytest.approx(traces[False], rel=1e-2)


def test_train_precision_float32_keeps_the_forward_in_float32():
    src, tgt_in, _ = (t.to(CUDA) for t in batch())
    dtypes = {}
    for precision in ("auto", "bf16", "float32"):
        m = model(seed=9).to(CUDA)
        trainer = Trainer(
            m, gpu_training(steps=2, precision=precision), tokens(200, 5), tokens(20, 6), seed=3
        )
        with trainer.autocast():
            dtypes[precision] = m(src, tgt_in).dtype
        trainer.close()
    assert dtypes == {"auto": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32}


def uniform_tokens(n: int, length: int, seed: int) -> TokenData:
    """``n`` rows of ``length`` ids on each side: every batch of them has one shape."""
    rng = np.random.default_rng(seed)
    ids = np.c_[rng.integers(4, V, (n, length - 1)), np.full(n, EOS_ID)].astype(np.uint16)
    offsets = np.arange(n + 1, dtype=np.int64) * length
    return TokenData(ids.reshape(-1), offsets, ids[:, ::-1].reshape(-1).copy(), offsets)


def test_cuda_graph_training_matches_eager_training_over_steps():
    config = gpu_training(steps=6, log_every=1, merge_micro_batches=True, precision="float32")
    traces = {}
    for static in (False, True):
        m = model(seed=10, dropout=0.0).to(CUDA)
        trainer = Trainer(
            m,
            dataclasses.replace(config, static_shapes=static),
            tokens(300, 3),
            tokens(20, 4),
            seed=2,
        )
        traces[static] = [trainer.train_step() for _ in range(6)]
        trainer.close()
    for key in ("loss", "grad_norm"):
        eager, graphed = ([m[key] for m in traces[s]] for s in (False, True))
        assert graphed == pytest.approx(eager, rel=1e-4), key  # float32, other shapes' sums
    assert traces[True][-1]["graph_shapes"] >= 1


def test_a_replayed_graph_draws_new_dropout_masks_and_makes_no_host_sync():
    # 512 rows of 16 tokens: four updates of 128 rows an epoch, all of one bucket shape
    config = gpu_training(steps=8, log_every=4, merge_micro_batches=True, static_shapes=True)
    m = model(seed=11, dropout=0.3).to(CUDA)
    trainer = Trainer(m, config, uniform_tokens(512, 16, 5), tokens(20, 6), seed=3)
    trainer.train_step()  # captures the one shape (syncs)
    trainer.train_step()  # the first replay
    assert trainer._static is not None and trainer._static.shapes == 1
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert trainer.train_step() == {}  # a replay: no host sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer._static.shapes == 1
    src, tgt_in, tgt_out = (t.to(CUDA) for t in trainer.prefetcher.next()[1][0])
    losses = [float(trainer._static(src, tgt_in, tgt_out)[0].detach()) for _ in range(2)]
    assert losses[0] != losses[1]  # the same batch, other dropout masks
    trainer.close()
