"""Training throughput: forward + backward tokens per second, and model-FLOPs utilisation on GPU.

CPU (float32): the debug and base sizes. CUDA (bf16 autocast): base and big, with MFU against
the device's dense bf16 peak (pass --peak-tflops for a device not in the table).

    python benchmarks/model_throughput.py --quick [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report, vocab_for  # noqa: E402

from transformer_core import BOS_ID, ModelConfig, Transformer, presets  # noqa: E402

# Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def training_flops(
    config: ModelConfig, vocab: int, batch: int, src_len: int, tgt_len: int
) -> float:
    """Model FLOPs of one forward + backward pass (as in the PaLM paper's MFU).

    A matmul with a weight of P entries costs 2P FLOPs per token forward and 4P backward, so
    6 * (weights a token passes through) * tokens: source tokens pass the encoder's matmul
    weights, target tokens the decoder's and the pre-softmax projection (D x V). Embedding
    lookups, layer norms and biases are not matmuls and are left out. Attention adds, per layer
    and forward, 2 * n_q * n_k * h * (d_k + d_v) FLOPs (QK^T and AV) for encoder self-attention
    (S x S), decoder self-attention (T x T; counted in full, though causal) and cross-attention
    (T x S); the backward pass doubles it again, hence the factor 3.
    """
    D, Fw, h = config.d_model, config.d_ff, config.n_heads
    dk, dv, N = config.head_dim_k, config.head_dim_v, config.n_layers
    attention_weights = D * h * dk * 2 + D * h * dv * 2  # W_Q, W_K, W_V, W_O
    ffn_weights = 2 * D * Fw
    encoder = N * (attention_weights + ffn_weights)
    decoder = N * (2 * attention_weights + ffn_weights) + D * vocab
    dense = 6 * batch * (encoder * src_len + decoder * tgt_len)
    scores = 2 * h * (dk + dv) * N * (src_len * src_len + tgt_len * tgt_len + tgt_len * src_len)
    return dense + 3 * batch * scores


def batch_of(vocab: int, batch: int, src_len: int, tgt_len: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    target = torch.randint(4, vocab, (batch, tgt_len), generator=g)
    tgt_in = torch.cat([torch.full((batch, 1), BOS_ID), target[:, :-1]], dim=1)
    return src.to(device), tgt_in.to(device), target.to(device)


def peak_tflops(device: torch.device) -> float | None:
    """The device's dense bf16 peak from the table, or None if it is not listed."""
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def measure(
    size: str,
    device: torch.device,
    dtype: torch.dtype,
    batch: int,
    length: int,
    steps: int,
    peak: float | None = None,
) -> dict:
    """Seconds per training step at a fixed batch, as tokens/s, TFLOP/s and (given a peak) MFU."""
    torch.manual_seed(0)
    config, vocab = presets.get(size), vocab_for(size)
    model = Transformer(config, vocab).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, target = batch_of(vocab, batch, length, length, device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step() -> None:
        with autocast:
            logits = model(src, tgt_in)
            loss = F.cross_entropy(
                logits.float().view(-1, vocab), target.view(-1), label_smoothing=0.1
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()  # warm-up: allocator, kernels
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    flops = training_flops(config, vocab, batch, length, length)
    row = {
        "model": size,
        "device": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "vocab": vocab,
        "batch": batch,
        "src=tgt_len": length,
        "s/step": seconds,
        "tgt_tok/s": batch * length / seconds,
        "src+tgt_tok/s": 2 * batch * length / seconds,
        "TFLOP/s": flops / seconds / 1e12,
    }
    if device.type == "cuda":
        row["MFU"] = flops / seconds / 1e12 / peak if peak else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps, smaller CPU batches")
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    steps = 5 if args.quick else 20
    cpu = torch.device("cpu")
    rows = [
        measure("debug", cpu, torch.float32, batch=32, length=25, steps=steps),
        measure("base", cpu, torch.float32, batch=8 if args.quick else 32, length=25, steps=steps),
    ]
    if torch.cuda.is_available():
        gpu = torch.device("cuda")
        peak = args.peak_tflops or peak_tflops(gpu)
        # 128 x 64 = 8k target tokens per step: a third of the paper's ~25k-token batch, which
        # the trainer reaches with gradient accumulation; it keeps big well within one GPU.
        for size in ("base", "big"):
            rows.append(measure(size, gpu, torch.bfloat16, 128, 64, steps, peak=peak))
    report("Training throughput: forward + backward + Adam step", rows, args.json)


if __name__ == "__main__":
    main()
