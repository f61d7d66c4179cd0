"""Our weights as CTranslate2's ``TransformerSpec``'s, and back (``CTranslate2Adapter``).

The paper's Transformer is CTranslate2's ``TransformerSpec`` as it stands (ReLU feed-forward,
post-norm or, with ``norm_first``, pre-norm with final norms, embeddings times sqrt(d_model)), so
our weights go onto the spec one to one: q/k/v fused the way CTranslate2 stores them, our
sinusoid table written out as the position encodings (its own table lays sines and cosines out
in halves, ours interleaves them), torch's layer-norm epsilon. The adapter's names are
CTranslate2's own variable names (``spec.variables()``: ``encoder/layer_0/ffn/linear_0/weight``);
``build_spec`` puts them on a spec with our vocabulary. The folder around the spec (tokenizer
files, ``export.json``, decoding options) is ``serving.ct2_export``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from transformer_core.config import ModelConfig
from transformer_core.special_ids import UNK_ID
from weight_adapters import WeightsError

if TYPE_CHECKING:
    from torch import Tensor

    from transformer_core.model import Transformer

__all__ = ["LAYER_NORM_EPS", "CTranslate2Adapter", "build_spec", "check_exportable"]

LAYER_NORM_EPS = 1e-5
"""torch.nn.LayerNorm's default; CTranslate2's own default is 1e-6."""
POSITIONS = "position_encodings/encodings"
"""Each stack's position table, under its stack's name."""


def check_exportable(config: ModelConfig) -> None:
    """WeightsError for the configs CTranslate2's spec cannot hold (different d_k and d_v)."""
    if config.head_dim_k != config.head_dim_v:
        raise WeightsError(
            f"d_k={config.head_dim_k} differs from d_v={config.head_dim_v}: CTranslate2's "
            "attention has one head width; use engine torch for this model"
        )


def _linear(theirs: str, ours: Sequence[str]) -> list[tuple[str, list[str]]]:
    """A linear layer's weight and bias: ours concatenated along the output rows (fused)."""
    return [(f"{theirs}/{leaf}", [f"{n}.{leaf}" for n in ours]) for leaf in ("weight", "bias")]


def _norm(theirs: str, ours: str) -> list[tuple[str, list[str]]]:
    return [(f"{theirs}/gamma", [f"{ours}.weight"]), (f"{theirs}/beta", [f"{ours}.bias"])]


def _names(config: ModelConfig) -> list[tuple[str, list[str]]]:
    """(CTranslate2's variable, our weights that make it, in order) for every weight but the
    position tables."""
    pairs = [
        ("encoder/embeddings_0/weight", ["src_embed.weight"]),
        ("decoder/embeddings/weight", ["tgt_embed.weight"]),
        ("decoder/projection/weight", ["generator.weight"]),
    ]
    if config.norm_first:
        pairs += _norm("encoder/layer_norm", "encoder_norm")
        pairs += _norm("decoder/layer_norm", "decoder_norm")
    for stack, layers in (("encoder", config.n_layers), ("decoder", config.n_decoder_layers)):
        for i in range(layers):
            theirs, ours = f"{stack}/layer_{i}", f"{stack}_layers.{i}"
            attn = f"{ours}.self_attn"
            # CTranslate2 stores self-attention's q, k, v as one fused projection.
            pairs += _linear(
                f"{theirs}/self_attention/linear_0", [f"{attn}.{n}_proj" for n in "qkv"]
            )
            pairs += _linear(f"{theirs}/self_attention/linear_1", [f"{attn}.out_proj"])
            pairs += _norm(f"{theirs}/self_attention/layer_norm", f"{ours}.norm1")
            if (
                stack == "decoder"
            ):  # queries from the decoder; keys and values (fused) from the encoder
                cross = f"{ours}.cross_attn"
                pairs += _linear(f"{theirs}/attention/linear_0", [f"{cross}.q_proj"])
                pairs += _linear(
                    f"{theirs}/attention/linear_1", [f"{cross}.{n}_proj" for n in "kv"]
                )
                pairs += _linear(f"{theirs}/attention/linear_2", [f"{cross}.out_proj"])
                pairs += _norm(f"{theirs}/attention/layer_norm", f"{ours}.norm2")
            pairs += _linear(f"{theirs}/ffn/linear_0", [f"{ours}.ffn.w1"])
            pairs += _linear(f"{theirs}/ffn/linear_1", [f"{ours}.ffn.w2"])
            last = "norm3" if stack == "decoder" else "norm2"
            pairs += _norm(f"{theirs}/ffn/layer_norm", f"{ours}.{last}")
    return pairs


class CTranslate2Adapter:
    """Our weights under CTranslate2's ``TransformerSpec`` variable names, for a model of
    ``config`` (float32 on the CPU)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def from_ours(self, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Fused projections concatenated, each stack's position table written out (ours: the
        learned table, or our sinusoids)."""
        import torch

        from transformer_core.model import sinusoids

        check_exportable(self.config)
        w = {k: v.detach().float().cpu() for k, v in ours.items()}
        out: dict[str, Tensor] = {}
        for theirs, names in _names(self.config):
            out[theirs] = torch.cat([w[n] for n in names]) if len(names) > 1 else w[names[0]]
        if self.config.positional == "learned":
            positions = w["pos_embed.weight"]
        else:  # the table our model computes (its pos_table)
            positions = sinusoids(self.config.max_len, self.config.d_model).float().cpu()
        for stack in ("encoder", "decoder"):
            out[f"{stack}/{POSITIONS}"] = positions
        return out

    def to_ours(self, theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``from_ours`` undone: fused projections split into equal parts (d_k = d_v), the
        learned position table kept (sinusoids are computed, not stored, by ours)."""
        ours: dict[str, Tensor] = {}
        for name, names in _names(self.config):
            ours.update(zip(names, theirs[name].chunk(len(names)), strict=True))
        if self.config.positional == "learned":
            ours["pos_embed.weight"] = theirs[f"encoder/{POSITIONS}"]
        return ours


def build_spec(model: Transformer, pieces: Sequence[str]) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and ``pieces`` as
    source and target vocabulary (``pieces[i]`` is token id i)."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config)
    for name, size in (("source", model.src_vocab_size), ("target", model.tgt_vocab_size)):
        if size != len(pieces):
            raise WeightsError(
                f"the model's {name} vocabulary has {size} ids but the tokenizer {len(pieces)}"
            )
    # Given only when it is not d_model / n_heads (Table 3 rows A change it).
    head_dim = None if config.head_dim_k * config.n_heads == config.d_model else config.head_dim_k
    layout = {
        "num_heads": config.n_heads,
        "pre_norm": config.norm_first,
        "activation": common_spec.Activation.RELU,
        "head_dim": head_dim,
    }
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(config.n_layers, **layout),
        transformer_spec.TransformerDecoderSpec(config.n_decoder_layers, **layout),
    )
    spec_config = spec.config
    # ctranslate2 has no type hints: its base class's None config reads as the only one.
    assert isinstance(spec_config, transformer_spec.TransformerConfig)
    spec_config.layer_norm_epsilon = LAYER_NORM_EPS
    # Our special pieces by id, whatever the tokenizer named them; the decoder starts from the
    # embedding of BOS, as our search does.
    spec_config.unk_token = pieces[UNK_ID]
    spec_config.bos_token = pieces[config.bos_id]
    spec_config.eos_token = pieces[config.eos_id]
    spec_config.decoder_start_token = pieces[config.bos_id]
    spec_config.add_source_eos = True  # our sources end with EOS: users pass the pieces alone
    for name, tensor in CTranslate2Adapter(config).from_ours(model.state_dict()).items():
        _assign(spec, name, tensor)
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    return spec


def _assign(spec: Any, name: str, value: Tensor) -> None:
    """Set the spec's variable ``name`` (``spec.variables()``'s: ``layer_0`` is item 0 of the
    list ``layer`` unless the layer has an attribute of that name, as the FFN's ``linear_0``)."""
    *path, leaf = name.split("/")
    for part in path:
        if hasattr(spec, part):
            spec = getattr(spec, part)
        else:
            field, _, index = part.rpartition("_")
            spec = getattr(spec, field)[int(index)]
    setattr(spec, leaf, value)
