"""The encoder-decoder Transformer of Vaswani et al. 2017, section 3, in one file.

Read top to bottom: positional encoding (3.5), multi-head attention (3.2), the position-wise
feed-forward network (3.3), encoder and decoder layers with post-layer-norm residuals (3.1),
and the full model with shared embeddings (3.4). Loss and decoding live elsewhere
(``loss.py``, ``search.py``); parallelism and mixed precision are applied by the trainer.

Shapes: B batch, S source length, T target length, D d_model, V vocabulary,
nh heads, hk / hv per-head key / value width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    """Self-attention then feed-forward, each as LayerNorm(x + Dropout(Sublayer(x)))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, D); src_mask (B, 1, 1, S) True at real source tokens."""
        k, v = self.self_attn.keys_values(x)
        x = self.norm1(x + self.dropout(self.self_attn(x, k, v, mask=src_mask)))
        x = self.norm2(x + self.dropout(self.ffn(x)))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, feed-forward; post-norm each."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.norm3 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        cross_kv: tuple[Tensor, Tensor],
        src_mask: Tensor,
        past_kv: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, T, D) holds the new positions; past_kv the cached self-attention keys/values of
        earlier positions. Returns the output and the self-attention keys/values so far."""
        k, v = self.self_attn.keys_values(x)  # (B, nh, T, hk), (B, nh, T, hv)
        n_past = 0
        if past_kv is not None:
            n_past = past_kv[0].size(2)
            k = torch.cat([past_kv[0], k], dim=2)  # (B, nh, n_past + T, hk)
            v = torch.cat([past_kv[1], v], dim=2)  # (B, nh, n_past + T, hv)
        # Targets are right-padded, so the causal mask alone keeps real positions from seeing
        # padding; outputs at padded positions are ignored by the loss.
        if n_past == 0:
            attended = self.self_attn(x, k, v, is_causal=True)  # SDPA's fused causal path
        else:
            attended = self.self_attn(x, k, v, mask=causal_mask(x.size(1), n_past, x.device))
        x = self.norm1(x + self.dropout(attended))
        x = self.norm2(x + self.dropout(self.cross_attn(x, *cross_kv, mask=src_mask)))
        x = self.norm3(x + self.dropout(self.ffn(x)))
        return x, (k, v)


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
    far, and cross-attention keys/values of the encoder output (computed once)."""

    self_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B, nh, t, hk), (B, nh, t, hv); t grows with every ``decode`` call."""
    cross_kv: list[tuple[Tensor, Tensor]]
    """Per layer: (B, nh, S, hk), (B, nh, S, hv)."""
    src_pad: Tensor
    """(B, S) bool, True at padding."""

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.self_kv[0][0].size(2)

    @property
    def batch_size(self) -> int:
        return self.src_pad.size(0)

    def reorder(self, indices: Tensor) -> DecoderState:
        """Keep rows ``indices`` (B',) in that order, in place: beams reorder, finished drop out."""

        def pick(t: Tensor) -> Tensor:
            return t.index_select(0, indices)

        self.self_kv = [(pick(k), pick(v)) for k, v in self.self_kv]
        self.cross_kv = [(pick(k), pick(v)) for k, v in self.cross_kv]
        self.src_pad = pick(self.src_pad)
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
        return Memory(states=x, src_pad=src_pad)

    def init_state(self, memory: Memory) -> DecoderState:
        """An empty incremental-decoding cache for ``memory``, with cross-attention keys/values."""
        B = memory.states.size(0)
        ref = memory.states
        empty_k = ref.new_zeros(B, self.config.n_heads, 0, self.config.head_dim_k)  # (B, nh, 0, hk)
        empty_v = ref.new_zeros(B, self.config.n_heads, 0, self.config.head_dim_v)  # (B, nh, 0, hv)
        return DecoderState(
            self_kv=[(empty_k, empty_v) for _ in self.decoder_layers],
            cross_kv=[layer.cross_attn.keys_values(memory.states) for layer in self.decoder_layers],
            src_pad=memory.src_pad,
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
        if tgt_in.size(0) != src_pad.size(0):
            raise ValueError(
                f"tgt_in has batch {tgt_in.size(0)} but the source has {src_pad.size(0)}"
            )
        src_mask = ~src_pad[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(tgt_in, self.tgt_embed, start=n_past)
        for i, layer in enumerate(self.decoder_layers):
            x, kv = layer(x, cross[i], src_mask, None if state is None else state.self_kv[i])
            if state is not None:
                state.self_kv[i] = kv
        return self.generator(x)  # (B, T, V)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for source (B, S) and decoder input (B, T)."""
        return self.decode(tgt_in, self.encode(src))


def count_parameters(model: nn.Module) -> int:
    """Number of parameter scalars, each shared tensor counted once."""
    unique = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in unique.values())
