"""``benchmarks/gpu.py``'s training rows: the paper's 25k-token step on synthetic WMT-shaped data,
the Trainer timed over its own logging interval, then profiled (``gpu_profile``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from gpu_profile import profile

from training.config import TrainConfig
from training.data import TokenData
from training.trainer import Trainer
from transformer_core import EOS_ID, Transformer, presets

VOCAB = 37_000
ROWS = 200_000
# WMT14 En-De with a 37k joint BPE: ~27 source and ~29 target pieces per pair on average, a
# long right tail; lengths are clipped to 2..250 (the shard stage drops rows past the limits).
SRC_LOG_MEAN, TGT_LOG_MEAN, LOG_SD = 3.12, 3.19, 0.62


def synthetic_corpus(rows: int, seed: int = 0) -> TokenData:
    """Random ids with WMT-like lengths, in the shards' CSR layout (the speed depends on shapes)."""
    rng = np.random.default_rng(seed)
    sides = []
    for mean in (SRC_LOG_MEAN, TGT_LOG_MEAN):
        lens = np.clip(np.rint(rng.lognormal(mean, LOG_SD, rows)), 2, 250).astype(np.int64)
        values = rng.integers(4, VOCAB, int(lens.sum()), dtype=np.int64).astype(np.uint16)
        ends = np.cumsum(lens)
        values[ends - 1] = EOS_ID
        sides += [values, np.r_[0, ends]]
    return TokenData(*sides)


def train_config(**changes: Any) -> TrainConfig:
    base = TrainConfig(
        steps=10_000,
        tokens_per_step=25_000,
        max_tokens_per_batch=25_000,
        warmup_steps=4000,
        use_gpu=True,
        pad_multiple=8,
        eval_every=10_000,
        checkpoint_every=0,
        checkpoint_minutes=0,
    )
    return dataclasses.replace(base, **changes)


def measure(trainer: Trainer, warmup: int, timed: int) -> dict[str, Any]:
    """``warmup`` steps (compilation, allocator, cuBLAS heuristics), then ``timed`` steps; the
    Trainer's own metrics over the timed interval (it syncs only at its logging steps)."""
    for _ in range(warmup - 1):
        trainer.train_step()
    trainer.train_step()  # logging step (log_every == warmup): closes the warm-up interval
    torch.cuda.reset_peak_memory_stats()
    for _ in range(timed - 1):
        trainer.train_step()
    metrics = trainer.train_step()
    metrics["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return metrics


def training_run(
    size: str, steps: int, corpus: TokenData, **switches: Any
) -> tuple[dict, list[dict], list[dict]]:
    """Throughput of ``steps`` timed steps after ``steps`` warm-up steps, then a profile of 3
    more: the row, GPU time by kernel kind, and the top kernels."""
    torch.manual_seed(0)
    module = Transformer(presets.get(size), VOCAB).cuda()
    tc = train_config(log_every=steps, **switches)
    trainer = Trainer(module, tc, corpus, corpus, seed=1)
    started = time.time()
    m = measure(trainer, steps, steps)
    kinds, top, busy, attention = profile(trainer)
    trainer.close()
    del trainer, module
    torch.cuda.empty_cache()
    row = {
        "model": size,
        "compile": "model" in tc.compile,
        "cudnn_attn": tc.cudnn_attention,
        "prefetch": tc.prefetch,
        "fused_loss": tc.fused_loss,
        "fused_adam": tc.fused_adam is not False,
        "pad": tc.pad_multiple,
        "tokens/s": m["tokens_per_s"],
        "tgt_tokens/s": m["target_tokens_per_s"],
        "TFLOP/s": m["tflops_per_worker"],
        "MFU": m["mfu"],
        "gpu_busy": busy,
        "peak_GiB": m["peak_memory_gb"],
        "graphs": compiled_graphs() if "model" in tc.compile else None,
        "attention kernels": attention,
        "wall_s": time.time() - started,
    }
    compiled = " compiled" if "model" in tc.compile else ""
    label = f"{size}{compiled}{' fused loss' if tc.fused_loss else ''}"
    return row, [{"run": label, **k} for k in kinds], [{"run": label, **t} for t in top]


def compiled_graphs() -> int:
    """Graphs compiled so far in this process (a recompilation storm shows here)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up_gpu(seconds: float = 10.0) -> None:
    """Matrix products until the clocks have left idle (the first run would pay for it)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()
