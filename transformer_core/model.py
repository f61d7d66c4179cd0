"""The encoder-decoder Transformer of Vaswani et al. 2017, section 3, in one file.

Read top to bottom: positional encoding (3.5), multi-head attention (3.2), the position-wise
feed-forward network (3.3), encoder and decoder layers with post-layer-norm residuals (3.1;
pre-norm with ``ModelConfig.norm_first``), and the full model with shared embeddings (3.4). Loss and decoding live elsewhere
(``loss.py``, ``search.py``); parallelism and mixed precision are applied by the trainer.

Shapes: B batch, S source length, T target length, D d_model, V vocabulary,
nh heads, hk / hv per-head key / value width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_core.config import ModelConfig

# ---------------------------------------------------------------------------------------------
# Positional encoding (section 3.5)


def sinusoids(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (ceil(D/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (max_len, ceil(D/2))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)[:, : d_model // 2]
    return table


# ---------------------------------------------------------------------------------------------
# Multi-head attention (section 3.2)


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

    def _split_heads(self, x: Tensor, head_dim: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, head_dim).transpose(1, 2)  # (B, nh, T, hs)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Project (B, S, D) into per-head keys (B, nh, S, hk) and values (B, nh, S, hv)."""
        k = self._split_heads(self.k_proj(x), self.d_k)  # (B, nh, S, hk)
        v = self._split_heads(self.v_proj(x), self.d_v)  # (B, nh, S, hv)
        return k, v

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """Queries from x (B, T, D) attend to k, v; ``mask`` is True where attention is allowed."""
        q = self._split_heads(self.q_proj(x), self.d_k)  # (B, nh, T, hk)
        dropout_p = self.attention_dropout if self.training else 0.0
        # softmax(q k^T / sqrt(d_k)) v: the default scale of SDPA is 1/sqrt(q.size(-1)) = 1/sqrt(d_k).
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )  # (B, nh, T, hv)
        B, _, T, _ = y.shape
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v)  # (B, T, nh*hv)
        return self.out_proj(y)  # (B, T, D)


    def weights(self, x: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """The attention probabilities (B, nh, T, S) that ``forward`` applies (no dropout)."""
        q = self._split_heads(self.q_proj(x), self.d_k)  # (B, nh, T, hk)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_k)  # (B, nh, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1)

    def forward_grouped(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, group: int, bias: bool = False
    ) -> Tensor:
        """Like ``forward`` for x (n*g, T, D) whose g consecutive rows share the keys/values
        k (n, nh, S, hk), v and mask (n, 1, 1, S): the g*T queries of a group attend together
        (beams of one sentence over its source), so k and v are never copied per row. With
        ``bias``, ``mask`` is additive (0 or -inf) and the attention runs as plain matmuls,
        about twice as fast on CPU as SDPA's kernel for the few queries of a decoding step."""
        B, T, _ = x.shape
        n = B // group
        q = self.q_proj(x).view(n, group * T, self.n_heads, self.d_k).transpose(1, 2)
        if bias:
            y = _small_attention(q, k, v, mask)  # (n, nh, g*T, hv)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (n, nh, g*T, hv)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v)  # (n*g, T, nh*hv)
        return self.out_proj(y)


def _small_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(d_k) + bias) v with plain matmuls (inference, no dropout)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.size(-1)))
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def causal_mask(n_new: int, n_past: int, device: torch.device) -> Tensor | None:
    """Boolean (n_new, n_past + n_new) mask: new query i sees keys 0 .. n_past + i. None if the
    mask allows everything (a single new position)."""
    if n_new == 1:
        return None
    return torch.ones(n_new, n_past + n_new, dtype=torch.bool, device=device).tril(diagonal=n_past)


# ---------------------------------------------------------------------------------------------
# Feed-forward network (section 3.3) and the two layer kinds (section 3.1)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.relu(self.w1(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each as LayerNorm(x + Dropout(Sublayer(x))), or with
    ``config.norm_first`` as x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, D); src_mask (B, 1, 1, S) True at real source tokens."""
        if self.norm_first:
            h = self.norm1(x)
            k, v = self.self_attn.keys_values(h)
            x = x + self.dropout(self.self_attn(h, k, v, mask=src_mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        k, v = self.self_attn.keys_values(x)
        x = self.norm1(x + self.dropout(self.self_attn(x, k, v, mask=src_mask)))
        x = self.norm2(x + self.dropout(self.ffn(x)))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, feed-forward; post-norm each
    (pre-norm with ``config.norm_first``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm3 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def _sublayer_in(self, norm: nn.LayerNorm, x: Tensor) -> Tensor:
        return norm(x) if self.norm_first else x

    def _residual(self, norm: nn.LayerNorm, x: Tensor, y: Tensor) -> Tensor:
        return x + self.dropout(y) if self.norm_first else norm(x + self.dropout(y))

    def forward(
        self,
        x: Tensor,
        cross_kv: tuple[Tensor, Tensor],
        src_mask: Tensor,
        state: DecoderState | None = None,
        layer: int = 0,
    ) -> Tensor:
        """x (B, T, D) holds the new positions; without ``state`` they are the whole target,
        with it they follow the cached ones (whose buffers of layer ``layer`` take the new
        self-attention keys/values in place)."""
        h = self._sublayer_in(self.norm1, x)
        k, v = self.self_attn.keys_values(h)  # (B, nh, T, hk), (B, nh, T, hv)
        n_past = 0
        group = 1
        if state is not None:
            n_past = state.self_kv[layer][0].size(2)  # this layer's length before the append
            group = state.group
            k, v = state._append(layer, k, v)  # (B, nh, n_past + T, hk), views of the buffers
        # Targets are right-padded, so the causal mask alone keeps real positions from seeing
        # padding; outputs at padded positions are ignored by the loss.
        # A decoding step on CPU (one new position, no dropout): plain-matmul attention, no mask.
        small = state is not None and x.size(1) == 1 and not self.training and x.device.type == "cpu"
        if small:
            attended = self.self_attn.forward_grouped(h, k, v, None, group=1, bias=True)
        elif n_past == 0:
            attended = self.self_attn(h, k, v, is_causal=True)  # SDPA's fused causal path
        else:
            attended = self.self_attn(h, k, v, mask=causal_mask(x.size(1), n_past, x.device))
        x = self._residual(self.norm1, x, attended)
        h = self._sublayer_in(self.norm2, x)
        if small:  # src_mask is then additive: 0 at real source tokens, -inf at padding
            crossed = self.cross_attn.forward_grouped(h, *cross_kv, src_mask, group, bias=True)
        elif group == 1:
            crossed = self.cross_attn(h, *cross_kv, mask=src_mask)
        else:  # the beams of a sentence share its cross-attention keys/values
            crossed = self.cross_attn.forward_grouped(h, *cross_kv, mask=src_mask, group=group)
        x = self._residual(self.norm2, x, crossed)
        return self._residual(self.norm3, x, self.ffn(self._sublayer_in(self.norm3, x)))


# ---------------------------------------------------------------------------------------------
# What passes between encoder, decoder and search


@dataclass
class Memory:
    """The encoder's output."""

    states: Tensor
    """(B, S, D) final encoder layer output."""
    src_pad: Tensor
    """(B, S) bool, True at padding."""

    def index_select(self, indices: Tensor) -> Memory:
        """The rows ``indices`` (used to expand a batch into beams)."""
        return Memory(self.states.index_select(0, indices), self.src_pad.index_select(0, indices))


@dataclass
class DecoderState:
    """Incremental decoding cache: per layer, self-attention keys/values of the positions fed so
    far, and cross-attention keys/values of the encoder output (computed once).

    The self-attention keys/values live in per-layer buffers preallocated along the time axis
    (``capacity`` positions, doubled when exceeded): each ``decode`` call writes its new
    positions in place, and ``reorder`` gathers the rows into a second buffer kept for that,
    so no step allocates or concatenates a growing cache. With ``group`` > 1, each row of
    ``cross_kv`` and ``src_pad`` serves ``group`` consecutive batch rows (the beams of one
    sentence), so reordering beams within their sentences never copies them."""

    self_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B, nh, t, hk), (B, nh, t, hv); t grows with every ``decode`` call."""
    cross_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B / group, nh, S, hk), (B / group, nh, S, hv)."""
    src_pad: Tensor
    """(B / group, S) bool, True at padding."""
    group: int = 1
    """Consecutive batch rows that share one row of ``cross_kv`` and ``src_pad``."""
    capacity: int = 0
    """Positions to preallocate in the self-attention buffers (a hint; they grow as needed)."""
    _buffers: list[tuple[Tensor, Tensor] | None] = field(init=False, repr=False)
    _spare: list[tuple[Tensor, Tensor] | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Per layer: the buffers the cached keys/values are views of, and a second pair that
        # reordering gathers into (then the two swap); None until a layer's first append.
        self._buffers = [None] * len(self.self_kv)
        self._spare = [None] * len(self.self_kv)

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.self_kv[0][0].size(2)

    @property
    def batch_size(self) -> int:
        return self.src_pad.size(0) * self.group

    def _buffer(self, layer: int, past: Tensor) -> tuple[Tensor, Tensor] | None:
        """Layer ``layer``'s buffers if ``past`` (its cached keys) is a view of them."""
        buf = self._buffers[layer]
        if buf is None or buf[0].data_ptr() != past.data_ptr() or buf[0].size(0) != past.size(0):
            return None
        return buf

    def _append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (B, nh, T, hk) of ``layer`` after the cached ones, in place;
        returns the views (B, nh, t + T, hk), (B, nh, t + T, hv) of everything so far."""
        past_k, past_v = self.self_kv[layer]
        t, T = past_k.size(2), k.size(2)
        buf = self._buffer(layer, past_k)
        if buf is None or buf[0].size(2) < t + T or buf[0].dtype != k.dtype:
            capacity = max(t + T, self.capacity, 2 * t, 8)
            B, nh = k.size(0), k.size(1)
            buf = (
                k.new_empty(B, nh, capacity, k.size(3)),
                v.new_empty(B, nh, capacity, v.size(3)),
            )
            if t:
                buf[0][:, :, :t].copy_(past_k)
                buf[1][:, :, :t].copy_(past_v)
            self._buffers[layer] = buf
        buf[0][:, :, t : t + T].copy_(k)
        buf[1][:, :, t : t + T].copy_(v)
        kv = (buf[0][:, :, : t + T], buf[1][:, :, : t + T])
        self.self_kv[layer] = kv
        return kv

    def _pick_self(self, indices: Tensor) -> None:
        """Keep rows ``indices`` of the self-attention cache, gathered into the spare buffers."""
        n = indices.size(0)
        for layer, (k, v) in enumerate(self.self_kv):
            buf = self._buffer(layer, k)
            t = k.size(2)
            if buf is None:  # not (yet) in a buffer: a plain gather
                self.self_kv[layer] = (k.index_select(0, indices), v.index_select(0, indices))
                continue
            spare = self._spare[layer]
            capacity = buf[0].size(2)
            if spare is None or spare[0].size(0) < n or spare[0].size(2) != capacity:
                spare = (
                    buf[0].new_empty(n, buf[0].size(1), capacity, buf[0].size(3)),
                    buf[1].new_empty(n, buf[1].size(1), capacity, buf[1].size(3)),
                )
            spare = (spare[0][:n], spare[1][:n])  # leading rows: still contiguous
            torch.index_select(k, 0, indices, out=spare[0][:, :, :t])
            torch.index_select(v, 0, indices, out=spare[1][:, :, :t])
            self._spare[layer], self._buffers[layer] = buf, spare
            self.self_kv[layer] = (spare[0][:, :, :t], spare[1][:, :, :t])

    def _pick_cross(self, indices: Tensor) -> None:
        self.cross_kv = [(k.index_select(0, indices), v.index_select(0, indices)) for k, v in self.cross_kv]
        self.src_pad = self.src_pad.index_select(0, indices)

    def reorder(self, indices: Tensor) -> DecoderState:
        """Keep rows ``indices`` (B',) in that order, in place: beams reorder, finished drop out."""
        if self.group > 1:  # rows may now mix sentences: one cross-attention row per batch row
            self._pick_cross(torch.div(indices, self.group, rounding_mode="floor"))
            self.group = 1
        else:
            self._pick_cross(indices)
        self._pick_self(indices)
        return self

    def regroup(self, rows: Tensor, groups: Tensor | None, group: int) -> DecoderState:
        """Beam search's reorder: keep self-attention rows ``rows`` (B',), keep cross-attention
        rows ``groups`` (all when None), and let each serve ``group`` consecutive rows. The
        caller guarantees that row i of the result belongs to group i // ``group``."""
        n_groups = self.src_pad.size(0) if groups is None else groups.size(0)
        if n_groups * group != rows.size(0):
            raise ValueError(f"{rows.size(0)} rows do not make {n_groups} groups of {group}")
        self._pick_self(rows)
        if groups is not None:
            self._pick_cross(groups)
        self.group = group
        return self


# ---------------------------------------------------------------------------------------------
# The model (sections 3.1 and 3.4)


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
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        if config.norm_first:  # pre-norm leaves the last residual sum unnormalised
            self.encoder_norm = nn.LayerNorm(D)
            self.decoder_norm = nn.LayerNorm(D)
        self._init_weights()

    def _init_weights(self) -> None:
        # Linear layers: Xavier-uniform, zero bias (tensor2tensor and fairseq). Embeddings:
        # N(0, d_model^-0.5), as tensor2tensor and fairseq do, because one matrix plays two roles:
        # times sqrt(d_model) at the input it has unit variance, matching the sinusoids' scale;
        # as the pre-softmax projection it keeps initial logits O(1) for unit-variance states.
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            elif isinstance(module, nn.Linear) and module is not self.generator:
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if not self.config.share_embeddings:  # an untied output embedding, initialised alike
            nn.init.normal_(self.generator.weight, mean=0.0, std=self.config.d_model**-0.5)

    # -- input checks and embedding ------------------------------------------------------------

    def _check_tokens(self, tokens: Tensor, vocab_size: int, name: str, n_past: int = 0) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"{name} must be (batch, length), got shape {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name} must hold integer token ids, got {tokens.dtype}")
        B, T = tokens.shape
        if B == 0 or T == 0:
            raise ValueError(f"{name} is empty: shape {tuple(tokens.shape)}")
        if n_past + T > self.config.max_len:
            raise ValueError(
                f"{name} reaches length {n_past + T}, longer than config.max_len={self.config.max_len}"
            )
        if tokens.device.type != "cpu":
            # Value checks read the tensor back to the host: a sync per call on an accelerator,
            # where the training loop cannot afford it. Shapes were checked above.
            return
        low, high = torch.aminmax(tokens)
        if int(low) < 0 or int(high) >= vocab_size:
            raise ValueError(
                f"{name} has token ids in [{int(low)}, {int(high)}], outside [0, {vocab_size})"
            )

    def _positions(self, start: int, length: int) -> Tensor:
        if self.config.positional == "learned":
            return self.pos_embed.weight[start : start + length]  # (T, D)
        return self.pos_table[start : start + length]  # (T, D)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, T, D)
        x = x + self._positions(start, tokens.size(1)).to(x.dtype)
        return self.dropout(x)

    # -- the paper's three entry points ---------------------------------------------------------

    def encode(self, src: Tensor) -> Memory:
        """Source ids (B, S) -> Memory(states (B, S, D), src_pad (B, S))."""
        self._check_tokens(src, self.src_vocab_size, "src")
        src_pad = src.eq(self.config.pad_id)  # (B, S)
        if src.device.type == "cpu" and bool(src_pad.all(dim=1).any()):
            raise ValueError("src has a row made only of padding; every source needs a token")
        src_mask = ~src_pad[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
        x = self._embed(src, self.src_embed)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        if self.config.norm_first:
            x = self.encoder_norm(x)
        return Memory(states=x, src_pad=src_pad)

    def init_state(self, memory: Memory, capacity: int = 0) -> DecoderState:
        """An empty incremental-decoding cache for ``memory``, with cross-attention keys/values;
        ``capacity`` (optional) preallocates that many target positions."""
        B = memory.states.size(0)
        ref = memory.states
        empty_k = ref.new_zeros(B, self.config.n_heads, 0, self.config.head_dim_k)  # (B, nh, 0, hk)
        empty_v = ref.new_zeros(B, self.config.n_heads, 0, self.config.head_dim_v)  # (B, nh, 0, hv)
        return DecoderState(
            self_kv=[(empty_k, empty_v) for _ in self.decoder_layers],
            cross_kv=[layer.cross_attn.keys_values(memory.states) for layer in self.decoder_layers],
            src_pad=memory.src_pad,
            capacity=min(capacity, self.config.max_len),
        )

    def decode(self, tgt_in: Tensor, memory: Memory, state: DecoderState | None = None) -> Tensor:
        """Decoder input ids (B, T) -> logits (B, T, V). With ``state``, ``tgt_in`` holds only
        the new positions, which continue from the cached length; ``state`` is updated and
        its own cross-attention cache and padding (reordered with it) are used, not ``memory``'s."""
        n_past = 0 if state is None else state.length
        self._check_tokens(tgt_in, self.tgt_vocab_size, "tgt_in", n_past=n_past)
        if state is None:
            cross = [layer.cross_attn.keys_values(memory.states) for layer in self.decoder_layers]
            src_pad = memory.src_pad
        else:
            cross, src_pad = state.cross_kv, state.src_pad
        batch = src_pad.size(0) if state is None else state.batch_size
        if tgt_in.size(0) != batch:
            raise ValueError(f"tgt_in has batch {tgt_in.size(0)} but the source has {batch}")
        src_mask = ~src_pad[:, None, None, :]  # (B, 1, 1, S), or (B / group, ...) with a state
        if state is not None and tgt_in.size(1) == 1 and not self.training and src_pad.device.type == "cpu":
            # The decoder layers' plain-matmul path for one step takes an additive mask.
            pad = src_pad[:, None, None, :]
            dtype = state.cross_kv[0][0].dtype
            src_mask = torch.zeros(pad.shape, dtype=dtype).masked_fill_(pad, float("-inf"))
        x = self._embed(tgt_in, self.tgt_embed, start=n_past)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, cross[i], src_mask, state=state, layer=i)
        if self.config.norm_first:
            x = self.decoder_norm(x)
        return self._logits(x)  # (B, T, V)

    _LOGIT_CHUNK = 2048

    def _logits(self, x: Tensor) -> Tensor:
        """The pre-softmax projection (B, T, D) -> (B, T, V). Without autograd on CPU it runs in
        vocabulary chunks of 2,048 rows written into one output: the same dot products (each
        logit is one full-width product, so bitwise the same values), split so that both
        threads of a small machine stay busy and each weight slice is read once per call
        (1.3x faster than one (B*T, D) x (D, V) GEMM on 2 threads at V = 37,000)."""
        if (
            type(self.generator) is not nn.Linear  # e.g. quantized for CPU inference
            or torch.is_grad_enabled()
            or x.device.type != "cpu"
            or x.dtype != self.generator.weight.dtype
            or torch.is_autocast_enabled(x.device.type)
        ):
            return self.generator(x)
        weight = self.generator.weight  # (V, D)
        rows = x.reshape(-1, x.size(-1))  # (B*T, D)
        V = weight.size(0)
        out = rows.new_empty(rows.size(0), V)
        for start in range(0, V, self._LOGIT_CHUNK):
            part = weight[start : start + self._LOGIT_CHUNK]  # (c, D), contiguous rows
            torch.mm(rows, part.t(), out=out[:, start : start + part.size(0)])
        return out.view(*x.shape[:-1], V)

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """Encoder-decoder attention probabilities of a teacher-forced pass, per decoder layer:
        (B, nh, T, S) each, rows summing to 1 over the real source positions. For looking at
        (attention maps), not for training: runs in eval mode and restores the mode after."""
        captured: list[Tensor] = []

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
            x, k = args[0], args[1]
            captured.append(module.weights(x, k, kwargs.get("mask")))

        was_training = self.training
        handles = [
            layer.cross_attn.register_forward_hook(hook, with_kwargs=True)
            for layer in self.decoder_layers
        ]
        try:
            self.eval()
            self.forward(src, tgt_in)
        finally:
            for handle in handles:
                handle.remove()
            self.train(was_training)
        return captured

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for source (B, S) and decoder input (B, T)."""
        return self.decode(tgt_in, self.encode(src))


def count_parameters(model: nn.Module) -> int:
    """Number of parameter scalars, each shared tensor counted once."""
    unique = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in unique.values())
