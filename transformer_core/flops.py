"""Model FLOPs of a training step, for throughput in FLOP/s and model-FLOPs utilisation (MFU).

Counted as PaLM's appendix B counts them: the multiply-adds of every matrix product the model
needs (2 FLOPs each), the attention products included and the causal one counted in full,
norms, softmax and elementwise work left out; a training step is 3x the forward pass (backward
twice the forward). Only real tokens count: padding is waste, so a batch planner that pads more
shows as lower MFU. ``forward_flops`` equals ``torch.utils.flop_counter.FlopCounterMode`` on an
unpadded batch (tests/unit/test_flops.py).
"""

from __future__ import annotations

import numpy as np

from transformer_core.config import ModelConfig

# Dense bf16 tensor-core peaks from the vendors' datasheets (FLOP/s), by device-name substring.
PEAK_BF16_FLOPS = {
    "H200": 989.4e12,
    "H100 PCIe": 756e12,
    "H100": 989.4e12,  # SXM
    "A100": 312e12,
    "L40S": 362.05e12,
    "A10G": 70e12,
    "L4": 121e12,
}


def forward_flops(
    config: ModelConfig, tgt_vocab: int, src_lens: np.ndarray, tgt_lens: np.ndarray
) -> float:
    """Matrix-product FLOPs of one teacher-forced forward pass over rows of the given lengths."""
    S = np.asarray(src_lens, dtype=np.float64)
    T = np.asarray(tgt_lens, dtype=np.float64)
    D, F, N = config.d_model, config.d_ff, config.n_layers
    M = config.n_decoder_layers
    qk, v = config.n_heads * config.head_dim_k, config.n_heads * config.head_dim_v
    # Per token and layer: the projections (q, k, v in, heads out) and the feed-forward network.
    attn_proj = 2 * D * (2 * qk + v) + 2 * v * D
    ffn = 4 * D * F
    encoder = N * S.sum() * (attn_proj + ffn) + N * (S * S).sum() * 2 * (qk + v)
    # Decoder: self-attention (causal, counted in full), cross-attention (queries and output
    # projection per target token, keys and values per source token), the feed-forward network.
    cross_q_out = 2 * D * qk + 2 * v * D
    cross_kv = 2 * D * (qk + v)
    decoder = (
        M * T.sum() * (attn_proj + cross_q_out + ffn)
        + M * S.sum() * cross_kv
        + M * (T * T).sum() * 2 * (qk + v)
        + M * (T * S).sum() * 2 * (qk + v)
    )
    generator = T.sum() * 2 * D * tgt_vocab
    return float(encoder + decoder + generator)


def train_flops(
    config: ModelConfig, tgt_vocab: int, src_lens: np.ndarray, tgt_lens: np.ndarray
) -> float:
    """FLOPs of forward and backward over these rows (3x the forward)."""
    return 3.0 * forward_flops(config, tgt_vocab, src_lens, tgt_lens)


def peak_flops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a CUDA device by name, or None if not in the table."""
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return peak
    return None
