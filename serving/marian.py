"""A checkpoint as a Hugging Face ``MarianMTModel`` folder, written without transformers.

The paper's Transformer (post-norm) is Hugging Face's ``MarianMTModel`` as it stands: ReLU
feed-forward, sinusoidal positions, embeddings times sqrt(d_model) (``scale_embedding``), torch's
layer norm, one matrix for source embedding, target embedding and output projection
(``share_encoder_decoder_embeddings``, ``tie_word_embeddings``), and a zero ``final_logits_bias``.
``export_marian`` writes what ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` read: ``config.json``, ``model.safetensors``,
``generation_config.json``, ``source.spm`` and ``target.spm`` (our sentencepiece model, twice),
``vocab.json`` and ``tokenizer_config.json``; then ``export.json`` (what it was made from).

Ids are ours unchanged (pad 0, unk 1, bos 2, eos 3, then the pieces in sentencepiece order):
the config names pad 0 as ``pad_token_id`` and BOS as ``decoder_start_token_id``, so nothing is
remapped and Marian's logits are ours column for column. (Converted Marian models put ``<pad>``
last and start the decoder from it; the config fields let us keep our order instead.)

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

Generation (``generation_config.json``): beam size as given, our length penalty's
((5 + |Y|) / 6)^alpha as Hugging Face's |Y|^length_penalty (``marian_length_penalty``),
PAD and BOS suppressed as our search does, and outputs capped at ``config.max_len`` tokens as
ours are; our per-sentence limit (source length + ``max_len_offset``) has no Hugging Face
equivalent, so callers who want it pass ``max_new_tokens``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving import ServingError
from transformer_core.config import ModelConfig
from transformer_core.folders import publish, sha256_file, temporary_sibling
from transformer_core.search_settings import fitted_penalty_exponent
from transformer_core.special_ids import UNK_ID

if TYPE_CHECKING:
    from torch import Tensor

    from transformer_core.model import Transformer

__all__ = [
    "INFO_FILE",
    "LAYER_NAMES",
    "WEIGHTS_FILE",
    "check_exportable",
    "export_marian",
    "marian_config",
    "marian_generation_config",
    "marian_length_penalty",
    "marian_state_dict",
    "permuted_state_dict",
    "residual_permutation",
    "save_marian",
]

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export.json"
"""Written last: what the export was made from; its presence marks the export complete."""

EXPORT_FORMAT = 1
"""Bumped when the mapping changes."""

# ----------------------------------------------------------------------------- what maps


def check_exportable(
    config: ModelConfig, vocab_size: int, tgt_vocab_size: int, pieces: int | None = None
) -> None:
    """ServingError, in one line, for a model ``MarianMTModel`` cannot hold, or one whose
    vocabularies do not match the tokenizer's ``pieces`` (when given)."""
    if config.norm_first:
        raise ServingError(
            "norm_first=True (pre-norm) cannot be exported to MarianMTModel: its layers are "
            "post-norm only (transformers has no pre-norm option for Marian)"
        )
    if config.positional != "sinusoidal":
        raise ServingError(
            f"positional={config.positional!r} cannot be exported to MarianMTModel: it always "
            "computes sinusoidal positions and reads no position weights"
        )
    if config.d_model % config.n_heads or {config.head_dim_k, config.head_dim_v} != {
        config.d_model // config.n_heads
    }:
        raise ServingError(
            f"d_k={config.head_dim_k}, d_v={config.head_dim_v} with n_heads={config.n_heads} "
            f"cannot be exported to MarianMTModel: its heads are d_model / n_heads = "
            f"{config.d_model / config.n_heads:g} wide"
        )
    if pieces is not None:
        for name, size in (("source", vocab_size), ("target", tgt_vocab_size)):
            if size != pieces:
                raise ServingError(
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
    out: dict[str, Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
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
            raise ServingError(f"no mapping for weight {name!r} (an unexpected model layout)")
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
    raise ServingError(f"no Marian name for weight {name!r}")


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights under ``MarianMTModel``'s names, residual stream permuted, each
    shared matrix once (under the name Marian ties the others to), plus the zero
    ``final_logits_bias``."""
    import torch

    check_exportable(model.config, model.src_vocab_size, model.tgt_vocab_size)
    weights = permuted_state_dict(model)
    out: dict[str, Tensor] = {}
    shared, tied = _sharing(model)
    if shared:
        out["model.shared.weight"] = weights["src_embed.weight"]
    else:
        out["model.encoder.embed_tokens.weight"] = weights["src_embed.weight"]
        out["model.decoder.embed_tokens.weight"] = weights["tgt_embed.weight"]
        if not tied:
            out["lm_head.weight"] = weights["generator.weight"]
    for name, tensor in weights.items():
        if name.startswith(("encoder_layers.", "decoder_layers.")):
            out[_marian_name(name)] = tensor
    out["final_logits_bias"] = torch.zeros(1, model.tgt_vocab_size)
    return out


def _sharing(model: Transformer) -> tuple[bool, bool]:
    """(source and target embeddings and output projection are one matrix, target embedding
    and output projection are one matrix)."""
    tied = model.generator.weight is model.tgt_embed.weight
    return tied and model.src_embed is model.tgt_embed, tied


# ----------------------------------------------------------------------------- configs


def marian_length_penalty(alpha: float) -> float:
    """Hugging Face's beam score is logp / |Y|^length_penalty, ours logp / ((5 + |Y|) / 6)^alpha
    (|Y| counting the EOS in both): the exponent fitted to ours over lengths 1..100
    (``fitted_penalty_exponent``, as the CTranslate2 export's): 0.4509 for the paper's
    alpha = 0.6."""
    return fitted_penalty_exponent(alpha)


def marian_config(model: Transformer) -> dict[str, Any]:
    """``config.json`` of a ``MarianMTModel`` with ``model``'s architecture and ids."""
    config = model.config
    shared, tied = _sharing(model)
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": model.src_vocab_size,
        "decoder_vocab_size": model.tgt_vocab_size,
        "share_encoder_decoder_embeddings": shared,
        "tie_word_embeddings": tied,
        "d_model": config.d_model,
        "encoder_layers": config.n_layers,
        "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": "relu",
        "max_position_embeddings": config.max_len,
        "scale_embedding": True,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": config.d_model**-0.5,
        "is_encoder_decoder": True,
        "use_cache": True,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "decoder_start_token_id": config.bos_id,
        "forced_eos_token_id": None,
        "dtype": "float32",
    }


def marian_generation_config(
    config: ModelConfig, beam_size: int = 4, alpha: float = 0.6
) -> dict[str, Any]:
    """``generation_config.json``: our beam search as closely as Hugging Face's can be told."""
    if beam_size < 1:
        raise ServingError(f"beam_size must be >= 1, got {beam_size}")
    if alpha < 0:
        raise ServingError(f"alpha must be >= 0, got {alpha}")
    return {
        "decoder_start_token_id": config.bos_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "pad_token_id": config.pad_id,
        "forced_eos_token_id": None,
        "num_beams": beam_size,
        "length_penalty": marian_length_penalty(alpha),
        # A sentence ends with k finished hypotheses, as in transformer_core.search.
        "early_stopping": True,
        # BOS + config.max_len tokens: our outputs are capped at max_len tokens.
        "max_length": config.max_len + 1,
        "suppress_tokens": sorted({config.pad_id, config.bos_id}),
    }


def _tokenizer_config(config: ModelConfig, pieces: Sequence[str]) -> dict[str, Any]:
    return {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": None,
        "target_lang": None,
        "unk_token": pieces[UNK_ID],
        "eos_token": pieces[config.eos_id],
        "pad_token": pieces[config.pad_id],
        "separate_vocabs": False,
        "sp_model_kwargs": {},
        "model_max_length": config.max_len,
    }


# ----------------------------------------------------------------------------- writing


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_marian(
    model: Transformer,
    spm_model: Path,
    out: Path,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    identity: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` with the sentencepiece model ``spm_model`` as a Marian folder ``out``
    through a temporary sibling renamed into place (an existing ``out`` is replaced)."""
    import sentencepiece as spm

    out, spm_model = Path(out), Path(spm_model)
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    config = model.config
    check_exportable(config, model.src_vocab_size, model.tgt_vocab_size, len(pieces))
    if len(set(pieces)) != len(pieces):
        raise ServingError(f"{spm_model} has repeated pieces: vocab.json cannot map them")
    generation = marian_generation_config(config, beam_size, alpha)
    weights = marian_state_dict(model)
    info = {
        **(identity or {}),
        "format": EXPORT_FORMAT,
        "model_config": config.to_dict(),
        "vocab_size": len(pieces),
        "residual_permutation": "evens-then-odds",
        "beam_size": beam_size,
        "alpha": alpha,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(out)
    try:
        tmp.mkdir()
        _write_json(tmp / "config.json", marian_config(model))
        from safetensors.torch import save_file  # the `export` extra; writes no pickle

        save_file(
            {k: v.contiguous() for k, v in weights.items()}, tmp / WEIGHTS_FILE, {"format": "pt"}
        )
        _write_json(tmp / "generation_config.json", generation)
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(spm_model, tmp / name)
        _write_json(tmp / "vocab.json", {piece: i for i, piece in enumerate(pieces)})
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config(config, pieces))
        _write_json(tmp / INFO_FILE, info)
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_marian(
    checkpoint: Path,
    tokenizer_dir: Path,
    out: Path,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
) -> Path:
    """Export ``checkpoint`` (a model.pt, or a folder holding one) with ``tokenizer_dir``'s
    sentencepiece model as a folder ``out`` that ``transformers.MarianMTModel.from_pretrained``
    and ``MarianTokenizer.from_pretrained`` load; ``beam_size`` and ``alpha`` (our length
    penalty) go into its generation config. Needs torch and sentencepiece, not transformers.
    Returns ``out``."""
    from serving import tokenizer as tokenizer_lib
    from transformer_core import checkpoint as checkpoint_lib

    checkpoint, out = checkpoint_lib.model_file(checkpoint), Path(out)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    tok = tokenizer_lib.load(Path(tokenizer_dir))
    data = checkpoint_lib.load(checkpoint)
    # Refuse what Marian cannot hold before building the model.
    try:
        config = ModelConfig.from_dict(data["config"])
    except (TypeError, ValueError) as exc:
        raise ServingError(f"{checkpoint} holds an invalid model config: {exc}") from exc
    vocab_size = data["vocab_size"]
    tgt_vocab_size = data.get("tgt_vocab_size") or vocab_size
    check_exportable(config, vocab_size, tgt_vocab_size, tok.vocab_size)
    model = checkpoint_lib.load_model(checkpoint, map_location="cpu")
    identity = {
        "checkpoint": str(checkpoint),
        "checkpoint_sha256": sha256_file(checkpoint),
        "tokenizer_sha256": sha256_file(tok.model_file),
    }
    return save_marian(
        model, tok.model_file, out, beam_size=beam_size, alpha=alpha, identity=identity
    )
