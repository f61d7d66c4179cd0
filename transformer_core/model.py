"""The encoder-decoder Transformer of Vaswani et al. 2017, section 3, in one file.

Read top to bottom: positional encoding (3.5), multi-head attention (3.2), the position-wise
feed-forward network (3.3), the residual connection around every sub-layer (5.4), encoder and
decoder layers (3.1), and the full model with shared embeddings (3.4). Given an incremental
state (``decoder_state.py``: cached keys/values) the decoder runs only new positions; search is in
``search.py``, the loss in ``loss.py``; the trainer applies parallelism and mixed precision.

Shapes: B batch, S source length, T target length, D d_model, V vocabulary,
nh heads, hk / hv per-head key / value width, g query rows sharing one row of keys/values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend

from transformer_core.config import ModelConfig
from transformer_core.decoder_state import DecoderState, LayerState
from transformer_core.init import Parts, initialise

# ---------------------------------------------------------------------------------------------
# Positional encoding (section 3.5)


def sinusoids(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d));
    (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (ceil(D/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (max_len, ceil(D/2))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)[:, : d_model // 2]
    return table


# ---------------------------------------------------------------------------------------------
# Multi-head attention (section 3.2)


NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA's kernels without cuDNN's, for ``torch.nn.attention.sdpa_kernel``: cuDNN's attention
builds an execution plan for every new shape (callers whose shapes keep changing avoid it)."""


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention: queries/keys d_model -> h*d_k, values
    d_model -> h*d_v, concatenated heads h*d_v -> d_model (Table 3 rows A/B vary d_k, d_v)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.d_k = config.head_dim_k
        self.d_v = config.head_dim_v
        self.q_proj = nn.Linear(config.d_model, self.n_heads * self.d_k)
        self.k_proj = nn.Linear(config.d_model, self.n_heads * self.d_k)
        self.v_proj = nn.Linear(config.d_model, self.n_heads * self.d_v)
        self.out_proj = nn.Linear(self.n_heads * self.d_v, config.d_model)
        self.attention_dropout = config.attention_dropout

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Project (B, S, D) into per-head keys (B, nh, S, hk) and values (B, nh, S, hv)."""
        B, S, _ = x.shape
        k = self.k_proj(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)  # (B, nh, S, hk)
        v = self.v_proj(x).view(B, S, self.n_heads, self.d_v).transpose(1, 2)  # (B, nh, S, hv)
        return k, v

    def forward(
        self,
        x: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        plain: bool = False,
    ) -> Tensor:
        """Queries from x (B, T, D) attend to k (B/g, nh, S, hk), v (B/g, nh, S, hv); ``mask``
        (B/g, 1, T or 1, S) is True where allowed. g consecutive rows of x (a sentence's beams)
        share a row of k, v and mask. ``plain``: plain matmuls, not SDPA (2x faster for one query
        per row on CPU), ``mask`` then additive (0 or -inf), no dropout."""
        B, T, _ = x.shape
        n = k.size(0)
        q = self.q_proj(x).view(n, B // n * T, self.n_heads, self.d_k)  # (B/g, g*T, nh, hk)
        q = q.transpose(1, 2)  # (B/g, nh, g*T, hk)
        if plain:
            y = _matmul_attention(q, k, v, mask)  # (B/g, nh, g*T, hv)
        else:
            dropout_p = self.attention_dropout if self.training else 0.0
            y = _sdpa(q, k, v, mask, dropout_p, is_causal)  # (B/g, nh, g*T, hv)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v)  # (B, T, nh*hv)
        return self.out_proj(y)  # (B, T, D)

    def causal_self_attention(self, x: Tensor, state: LayerState | None = None) -> Tensor:
        """Masked self-attention of x (B, T, D): position i sees 0 .. i. With ``state``, x
        follows the cached positions; its keys/values are appended; the state says how to mask."""
        k, v = self.keys_values(x)  # (B, nh, T, hk), (B, nh, T, hv)
        if state is None:
            return self(x, k, v, is_causal=True)
        k, v = state.append(k, v)  # (B, nh, t + T, hk), (B, nh, t + T, hv): the cached, then x's
        return self(x, k, v, state.self_mask, is_causal=state.is_causal, plain=state.plain)

    def weights(self, x: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """The attention probabilities (B, nh, T, S) that ``forward`` applies (no dropout)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, nh, T, hk)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_k)  # (B, nh, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1)


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool
) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v by SDPA (its default scale is 1/sqrt(q.size(-1))). bf16 on a
    CPU (``train.precision: bf16``) runs it in float32: torch's CPU flash attention took 7x
    longer for its backward in bf16 than in float32 (the Multi30k recipe's model,
    torch.profiler)."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    if mask is not None and mask.is_floating_point():  # an additive mask: float32 as well
        mask = mask.float()
    with torch.autocast("cpu", enabled=False):
        y = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), mask, dropout_p=dropout_p, is_causal=is_causal
        )
    return y.to(q.dtype)


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(d_k) + bias) v with plain matmuls (no dropout)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.size(-1)))  # (.., Tq, S)
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# ---------------------------------------------------------------------------------------------
# Feed-forward network (section 3.3), residual connections (5.4), the two layer kinds (3.1)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.relu(self.w1(x)))


class ResidualLayer(nn.Module):
    """Base of both layer kinds: the residual connection and layer norm around each sub-layer."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def sublayer(self, norm: nn.LayerNorm, x: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
        """Sub-layer f with its residual connection: post-norm LayerNorm(x + Dropout(f(x))), the
        paper's, or with ``config.norm_first`` pre-norm x + Dropout(f(LayerNorm(x)))."""
        if self.norm_first:
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))


class EncoderLayer(ResidualLayer):
    """Self-attention, then feed-forward, each inside ``sublayer``."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm2 = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, D); src_mask (B, 1, 1, S) True at real source tokens."""

        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn(h, *self.self_attn.keys_values(h), mask=src_mask)

        x = self.sublayer(self.norm1, x, self_attention)
        return self.sublayer(self.norm2, x, self.ffn)


class DecoderLayer(ResidualLayer):
    """Masked self-attention, attention over the encoder output, feed-forward, in ``sublayer``s."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm3 = nn.LayerNorm(config.d_model)

    def forward(
        self, x: Tensor, memory: Tensor | None, src_mask: Tensor, state: LayerState | None = None
    ) -> Tensor:
        """x (B, T, D) the whole target; memory (B, S, D) the encoder output; src_mask
        (B, 1, 1, S) True at real source tokens. With ``state`` x holds only new positions,
        memory (None) is the state's keys/values, src_mask (B/g, 1, 1, S), additive if plain."""
        if state is None:
            assert memory is not None  # Transformer.decode checks it
            k, v = self.cross_attn.keys_values(memory)  # (B, nh, S, hk), (B, nh, S, hv)
        else:
            k, v = state.cross_kv  # (B/g, nh, S, hk), (B/g, nh, S, hv)

        # Targets are right-padded, so the causal mask alone keeps real positions from seeing
        # padding; outputs at padded positions are ignored by the loss.
        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn.causal_self_attention(h, state)

        def cross_attention(h: Tensor) -> Tensor:
            return self.cross_attn(h, k, v, mask=src_mask, plain=state is not None and state.plain)

        x = self.sublayer(self.norm1, x, self_attention)
        x = self.sublayer(self.norm2, x, cross_attention)
        return self.sublayer(self.norm3, x, self.ffn)


# ---------------------------------------------------------------------------------------------
# The model (sections 3.1 and 3.4)


@dataclass
class Memory:
    """The encoder's output."""

    states: Tensor
    """(B, S, D) final encoder layer output."""
    src_pad: Tensor
    """(B, S) bool, True at padding."""


class Transformer(nn.Module):
    """Encoder-decoder Transformer. With ``config.share_embeddings`` and one joint vocabulary,
    source embedding, target embedding and pre-softmax projection are the same tensor
    (section 3.4); with a distinct ``tgt_vocab_size`` the source has its own embedding and
    the target embedding stays tied to the pre-softmax projection."""

    def __init__(self, config: ModelConfig, vocab_size: int, tgt_vocab_size: int | None = None):
        super().__init__()
        if tgt_vocab_size is None:
            tgt_vocab_size = vocab_size
        for name, size in (("vocab_size", vocab_size), ("tgt_vocab_size", tgt_vocab_size)):
            special = max(config.pad_id, config.bos_id, config.eos_id)
            if not isinstance(size, int) or size <= special:
                raise ValueError(
                    f"{name}={size!r} must be an int above the special ids (<= {special})"
                )
        self.config = config
        self.src_vocab_size = vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        D = config.d_model

        self.src_embed = nn.Embedding(vocab_size, D)
        joint = tgt_vocab_size == vocab_size and config.share_embeddings
        self.tgt_embed = self.src_embed if joint else nn.Embedding(tgt_vocab_size, D)
        self.generator = nn.Linear(D, tgt_vocab_size, bias=False)  # pre-softmax projection
        if config.share_embeddings:
            self.generator.weight = self.tgt_embed.weight
        if config.positional == "learned":
            self.pos_embed = nn.Embedding(config.max_len, D)
        else:
            # Not persistent: recomputed on construction, so checkpoints hold only learned weights.
            self.register_buffer("pos_table", sinusoids(config.max_len, D), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(config.n_decoder_layers)
        )
        if config.norm_first:  # pre-norm leaves the last residual sum unnormalised
            self.encoder_norm = nn.LayerNorm(D)
            self.decoder_norm = nn.LayerNorm(D)
        attentions = [m for m in self.modules() if isinstance(m, MultiHeadAttention)]
        parts = Parts(
            qkv=[p for a in attentions for p in (a.q_proj, a.k_proj, a.v_proj)],
            out=[a.out_proj for a in attentions],
            ffn=[w for m in self.modules() if isinstance(m, FeedForward) for w in (m.w1, m.w2)],
            token_embeddings=list({self.src_embed: None, self.tgt_embed: None}),  # once if shared
            generator=self.generator,
        )
        initialise(self, config, parts)  # config.init's scheme

    # -- input checks and embedding ------------------------------------------------------------

    def check_shape(self, tokens: Tensor, name: str, start: int = 0) -> None:
        """ValueError unless ``tokens`` is a non-empty (B, T) integer tensor whose positions
        start .. start + T - 1 fit ``config.max_len``. Reads no values: no host sync."""
        if tokens.dim() != 2:
            raise ValueError(f"{name} must be (batch, length), got shape {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name} must hold integer token ids, got {tokens.dtype}")
        B, T = tokens.shape
        if B == 0 or T == 0:
            raise ValueError(f"{name} is empty: shape {tuple(tokens.shape)}")
        if start + T > self.config.max_len:
            raise ValueError(
                f"{name} reaches length {start + T}, "
                f"longer than config.max_len={self.config.max_len}"
            )

    def check_values(self, src: Tensor | None = None, tgt_in: Tensor | None = None) -> None:
        """ValueError for ids outside the vocabularies or a source row made only of padding
        (after ``check_shape``). Reads the values back to the host, so ``encode`` and ``decode``
        leave it to callers that can afford a sync: search calls it, the training loop does not."""
        for tokens, name, vocab_size in (
            (src, "src", self.src_vocab_size),
            (tgt_in, "tgt_in", self.tgt_vocab_size),
        ):
            if tokens is None:
                continue
            self.check_shape(tokens, name)
            low, high = (int(t) for t in torch.aminmax(tokens))
            if low < 0 or high >= vocab_size:
                raise ValueError(
                    f"{name} has token ids in [{low}, {high}], outside [0, {vocab_size})"
                )
        # A source of only padding would leave its attention rows nothing to attend to (NaN).
        if src is not None and bool(src.eq(self.config.pad_id).all(dim=1).any()):
            raise ValueError("src has a row made only of padding; every source needs a token")

    def _positions(self, start: int, length: int) -> Tensor:
        if self.config.positional == "learned":
            return self.pos_embed.weight[start : start + length]  # (T, D)
        return self.pos_table[start : start + length]  # (T, D)

    def embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        """Ids (B, T) at positions start .. start + T - 1 -> Dropout(E sqrt(D) + PE) (B, T, D)."""
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, T, D)
        x = x + self._positions(start, tokens.size(1)).to(x.dtype)
        return self.dropout(x)

    # -- the paper's three entry points ---------------------------------------------------------

    def encode(self, src: Tensor) -> Memory:
        """Source ids (B, S) -> Memory(states (B, S, D), src_pad (B, S))."""
        self.check_shape(src, "src")
        src_pad = src.eq(self.config.pad_id)  # (B, S)
        src_mask = ~src_pad[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
        x = self.embed(src, self.src_embed)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        if self.config.norm_first:
            x = self.encoder_norm(x)
        return Memory(states=x, src_pad=src_pad)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Memory | None,
        project: bool = True,
        state: DecoderState | None = None,
    ) -> Tensor:
        """Decoder input ids (B, T), the whole target prefix -> logits (B, T, V); without
        ``project``, the last states (B, T, D) before the pre-softmax projection. With ``state``,
        only the positions after its ``length`` cached ones; memory None (the state holds it)."""
        if state is None:
            if memory is None:
                raise ValueError("decode needs the encoder output (memory) or a state")
            self.check_shape(tgt_in, "tgt_in")
            if (B := tgt_in.size(0)) != (n := memory.src_pad.size(0)):
                raise ValueError(f"tgt_in has batch {B} but the source has {n}")
            src_mask = ~memory.src_pad[:, None, None, :]  # (B, 1, 1, S)
            memory_states, layer_states = memory.states, [None] * len(self.decoder_layers)
        else:
            self.check_shape(tgt_in, "tgt_in", start=state.length)
            src_mask = state.start_step(tgt_in, self.training)  # (B/g, 1, 1, S)
            memory_states, layer_states = None, state.layers
        x = self.embed(tgt_in, self.tgt_embed, start=0 if state is None else state.length)
        for layer, layer_state in zip(self.decoder_layers, layer_states, strict=True):
            x = layer(x, memory_states, src_mask, layer_state)
        if self.config.norm_first:
            x = self.decoder_norm(x)
        return self.generator(x) if project else x  # (B, T, V) or (B, T, D)

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced logits (B, T, V) for source (B, S) and decoder input (B, T); without
        ``project``, the decoder's last states (B, T, D), for a loss fused with the projection
        (transformer_core.loss.linear_label_smoothed_nll)."""
        return self.decode(tgt_in, self.encode(src), project)


def count_parameters(model: nn.Module) -> int:
    """Number of parameter scalars, each shared tensor counted once."""
    unique = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in unique.values())
