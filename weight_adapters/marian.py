"""Our weights as Hugging Face's ``MarianMTModel``'s, and back (``MarianAdapter``).

The paper's Transformer (post-norm) is ``MarianMTModel`` as it stands: ReLU feed-forward,
sinusoidal positions, embeddings times sqrt(d_model), torch's layer norm, one matrix for source
embedding, target embedding and output projection (``share_encoder_decoder_embeddings``,
``tie_word_embeddings``), and a zero ``final_logits_bias``. The folder around the weights
(configs, tokenizer files) is ``serving.marian_export``'s.

Ids are ours unchanged (pad 0, unk 1, bos 2, eos 3, then the pieces in sentencepiece order), so
no row is remapped and Marian's logits are ours column for column.

Positions: Marian computes its own sinusoid table on load (it is not read from the weights) and
lays the sines in the first half of the width and the cosines in the second; ours interleave them
(sin at 2i, cos at 2i+1), with the same frequencies. Marian's table is ours with its columns
permuted (``residual_permutation``: the even columns, then the odd ones), so the export permutes
the residual stream the same way: every weight that reads from it (embeddings, output projection,
q/k/v projections, the first feed-forward layer) has its input columns permuted, every weight
that writes to it (attention output, second feed-forward layer) its output rows and bias, and the
layer norms (which do not care about the order of the features) their gain and bias. The model
is then exactly ours, features renamed; logits agree to float rounding.

What Marian cannot express is refused with one line (``check_exportable``): pre-norm (its layers
are post-norm only), learned positions (it always computes sinusoids), and head widths other
than d_model / n_heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from transformer_core.config import ModelConfig
from weight_adapters import WeightsError

if TYPE_CHECKING:
    from torch import Tensor

    from transformer_core.model import Transformer

__all__ = [
    "LAYER_NAMES",
    "MarianAdapter",
    "check_exportable",
    "marian_state_dict",
    "permuted_state_dict",
    "residual_permutation",
    "sharing",
]


def check_exportable(
    config: ModelConfig, vocab_size: int, tgt_vocab_size: int, pieces: int | None = None
) -> None:
    """WeightsError, in one line, for a model ``MarianMTModel`` cannot hold, or one whose
    vocabularies do not match the tokenizer's ``pieces`` (when given)."""
    if config.norm_first:
        raise WeightsError(
            "norm_first=True (pre-norm) cannot be exported to MarianMTModel: its layers are "
            "post-norm only (transformers has no pre-norm option for Marian)"
        )
    if config.positional != "sinusoidal":
        raise WeightsError(
            f"positional={config.positional!r} cannot be exported to MarianMTModel: it always "
            "computes sinusoidal positions and reads no position weights"
        )
    if config.d_model % config.n_heads or {config.head_dim_k, config.head_dim_v} != {
        config.d_model // config.n_heads
    }:
        raise WeightsError(
            f"d_k={config.head_dim_k}, d_v={config.head_dim_v} with n_heads={config.n_heads} "
            f"cannot be exported to MarianMTModel: its heads are d_model / n_heads = "
            f"{config.d_model / config.n_heads:g} wide"
        )
    if pieces is not None:
        for name, size in (("source", vocab_size), ("target", tgt_vocab_size)):
            if size != pieces:
                raise WeightsError(
                    f"the model's {name} vocabulary has {size} ids but the tokenizer has "
                    f"{pieces} pieces: export it with the tokenizer it was trained with"
                )


def residual_permutation(d_model: int) -> list[int]:
    """``perm`` with Marian's sinusoid column m equal to our column ``perm[m]``: the even
    columns (sines), then the odd ones (cosines)."""
    return [*range(0, d_model, 2), *range(1, d_model, 2)]


def permuted_state_dict(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights (our names, float32, detached copies) with the residual stream's
    features in ``residual_permutation`` order; tied matrices appear under each of their names.

    Loaded into a model whose position table is ours permuted the same way, it computes the same
    logits: this is the whole change the export makes to the numbers."""
    import torch

    perm = torch.tensor(residual_permutation(model.config.d_model))
    return _permuted(model.state_dict(keep_vars=False), perm)


def _permuted(state: Mapping[str, Tensor], perm: Tensor) -> dict[str, Tensor]:
    """``state`` (our names) with the residual stream's features taken in ``perm``'s order
    (float32 copies); the inverse permutation undoes it."""
    import torch

    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        w = tensor.detach().to("cpu", torch.float32)
        parts = name.split(".")
        leaf, module = parts[-1], parts[-2]
        if name in ("src_embed.weight", "tgt_embed.weight", "generator.weight"):
            w = w[:, perm]  # (V, D): reads from / writes to the residual stream along D
        elif module in ("q_proj", "k_proj", "v_proj", "w1"):
            w = w[:, perm] if leaf == "weight" else w  # reads from the residual stream
        elif module in ("out_proj", "w2"):
            w = w[perm]  # writes to it: output rows and bias
        elif module.startswith("norm"):
            w = w[perm]  # per-feature gain and bias
        else:
            raise WeightsError(f"no mapping for weight {name!r} (an unexpected model layout)")
        out[name] = w.clone()
    return out


LAYER_NAMES = {
    "encoder": {
        "self_attn": "self_attn",
        "norm1": "self_attn_layer_norm",
        "ffn.w1": "fc1",
        "ffn.w2": "fc2",
        "norm2": "final_layer_norm",
    },
    "decoder": {
        "self_attn": "self_attn",
        "norm1": "self_attn_layer_norm",
        "cross_attn": "encoder_attn",
        "norm2": "encoder_attn_layer_norm",
        "ffn.w1": "fc1",
        "ffn.w2": "fc2",
        "norm3": "final_layer_norm",
    },
}
"""Our layer weights' names -> fairseq's, which Hugging Face's Marian kept (per stack)."""


def _marian_name(name: str) -> str:
    """Our layer weight name -> ``MarianMTModel``'s (``encoder_layers.0.norm1.weight`` ->
    ``model.encoder.layers.0.self_attn_layer_norm.weight``)."""
    stack, index, rest = name.split(".", 2)
    side = stack.removesuffix("_layers")
    for ours, theirs in LAYER_NAMES[side].items():
        if rest.startswith(ours + "."):
            return f"model.{side}.layers.{index}.{theirs}{rest[len(ours) :]}"
    raise WeightsError(f"no Marian name for weight {name!r}")


def _our_name(name: str) -> str:
    """``MarianMTModel``'s layer weight name -> ours (``_marian_name`` undone)."""
    _, side, _, index, rest = name.split(".", 4)
    for ours, theirs in LAYER_NAMES[side].items():
        if rest.startswith(theirs + "."):
            return f"{side}_layers.{index}.{ours}{rest[len(theirs) :]}"
    raise WeightsError(f"no weight of ours for Marian's {name!r}")


class MarianAdapter:
    """Our weights under ``MarianMTModel``'s names, residual stream permuted, for a model of
    ``config`` whose embeddings and output projection are one matrix (``shared``) or whose
    target embedding and output projection are (``tied``)."""

    def __init__(
        self,
        config: ModelConfig,
        vocab_size: int,
        tgt_vocab_size: int,
        *,
        shared: bool,
        tied: bool,
    ) -> None:
        self.config, self.vocab_size, self.tgt_vocab_size = config, vocab_size, tgt_vocab_size
        self.shared, self.tied = shared, tied

    @classmethod
    def of(cls, model: Transformer) -> MarianAdapter:
        """The adapter for ``model``'s config, vocabularies and sharing."""
        shared, tied = sharing(model)
        vocab_sizes = (model.src_vocab_size, model.tgt_vocab_size)
        return cls(model.config, *vocab_sizes, shared=shared, tied=tied)

    def from_ours(self, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Each shared matrix once (under the name Marian ties the others to), plus the zero
        ``final_logits_bias``."""
        import torch

        check_exportable(self.config, self.vocab_size, self.tgt_vocab_size)
        perm = torch.tensor(residual_permutation(self.config.d_model))
        weights = _permuted(ours, perm)
        out: dict[str, Tensor] = {}
        if self.shared:
            out["model.shared.weight"] = weights["src_embed.weight"]
        else:
            out["model.encoder.embed_tokens.weight"] = weights["src_embed.weight"]
            out["model.decoder.embed_tokens.weight"] = weights["tgt_embed.weight"]
            if not self.tied:
                out["lm_head.weight"] = weights["generator.weight"]
        for name, tensor in weights.items():
            if name.startswith(("encoder_layers.", "decoder_layers.")):
                out[_marian_name(name)] = tensor
        out["final_logits_bias"] = torch.zeros(1, self.tgt_vocab_size)
        return out

    def to_ours(self, theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``from_ours`` undone: tied matrices under each of our names, the residual stream in
        our order (``final_logits_bias``, zero in ours, is dropped)."""
        import torch

        if self.shared:
            src = tgt = generator = theirs["model.shared.weight"]
        else:
            src = theirs["model.encoder.embed_tokens.weight"]
            tgt = theirs["model.decoder.embed_tokens.weight"]
            generator = tgt if self.tied else theirs["lm_head.weight"]
        ours = {"src_embed.weight": src, "tgt_embed.weight": tgt, "generator.weight": generator}
        for name, tensor in theirs.items():
            if name.startswith(("model.encoder.layers.", "model.decoder.layers.")):
                ours[_our_name(name)] = tensor
        inverse = torch.argsort(torch.tensor(residual_permutation(self.config.d_model)))
        return _permuted(ours, inverse)


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights under ``MarianMTModel``'s names (``MarianAdapter``)."""
    return MarianAdapter.of(model).from_ours(model.state_dict(keep_vars=False))


def sharing(model: Transformer) -> tuple[bool, bool]:
    """(source and target embeddings and output projection are one matrix, target embedding
    and output projection are one matrix)."""
    tied = model.generator.weight is model.tgt_embed.weight
    return tied and model.src_embed is model.tgt_embed, tied
