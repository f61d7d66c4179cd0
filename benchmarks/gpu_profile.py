"""``benchmarks/gpu.py``'s profile: GPU time by kernel kind, the top kernels, the share of wall time
the GPU was busy and which attention kernels ran, over a few more training steps."""

from __future__ import annotations

import time

import torch

from training.trainer import Trainer

KINDS = (
    ("attention", ("flash", "fmha", "attention", "efficient")),
    ("matmul", ("gemm", "cutlass", "sm90", "xmma", "nvjet", "cublas")),
    ("optimizer", ("adam", "multi_tensor")),
    ("softmax / loss", ("softmax", "nll", "log_softmax", "cross_entropy")),
    ("copy", ("memcpy", "memset", "copy")),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    for kind, keys in KINDS:
        if any(k in lower for k in keys):
            return kind
    return "elementwise / other"


def profile(trainer: Trainer, steps: int = 3) -> tuple[list[dict], list[dict], float, str]:
    """GPU time by kernel kind and the top kernels over ``steps`` more training steps; the share
    of wall time the GPU was busy; the attention kernels that ran."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.train_step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in kernels) or 1.0
    by_kind: dict[str, float] = {}
    for e in kernels:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_device_time_total
    kinds = [
        {"kind": k, "ms/step": t / 1000 / steps, "share": t / total}
        for k, t in sorted(by_kind.items(), key=lambda kv: -kv[1])
    ]
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:10]
    tops = [
        {
            "kernel": e.key[:80],
            "kind": kind_of(e.key),
            "calls/step": e.count // steps,
            "ms/step": e.self_device_time_total / 1000 / steps,
            "share": e.self_device_time_total / total,
        }
        for e in top
    ]
    attention = sorted({attention_kernel(e.key) for e in kernels} - {None})
    return kinds, tops, total / 1e6 / wall, ", ".join(attention)


def attention_kernel(name: str) -> str | None:
    """A short name for an SDPA kernel (forward or backward), None for anything else."""
    lower = name.lower()
    if "cudnn" in lower and "sdpa" in lower:
        return "cuDNN"
    if "flash" in lower:
        return "flash"
    if "fmha" in lower or "efficient_attention" in lower or "mem_eff" in lower:
        return "efficient"
    return None
