"""A checkpoint as a Hugging Face ``MarianMTModel`` folder, written without transformers.

The paper's Transformer (post-norm) is Hugging Face's ``MarianMTModel`` as it stands: ReLU
feed-forward, sinusoidal positions, embeddings times sqrt(d_model) (``scale_embedding``), torch's
layer norm, one matrix for source embedding, target embedding and output projection
(``share_encoder_decoder_embeddings``, ``tie_word_embeddings``), and a zero ``final_logits_bias``.
``export_marian`` writes what ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` read: ``config.json``, ``model.safetensors``,
``generation_config.json``, ``source.spm`` and ``target.spm`` (our sentencepiece model, twice),
``vocab.json`` and ``tokenizer_config.json``; then ``export.json`` (what it was made from).
The weights are ``weight_adapters.marian``'s (names, the residual stream's order, what Marian
cannot hold).

Ids are ours unchanged (pad 0, unk 1, bos 2, eos 3, then the pieces in sentencepiece order):
the config names pad 0 as ``pad_token_id`` and BOS as ``decoder_start_token_id``, so nothing is
remapped and Marian's logits are ours column for column. (Converted Marian models put ``<pad>``
last and start the decoder from it; the config fields let us keep our order instead.)

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
from weight_adapters import weight_errors_as
from weight_adapters.marian import check_exportable, marian_state_dict, sharing

if TYPE_CHECKING:
    from transformer_core.model import Transformer

__all__ = [
    "INFO_FILE",
    "WEIGHTS_FILE",
    "export_marian",
    "marian_config",
    "marian_generation_config",
    "marian_length_penalty",
    "save_marian",
]

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export.json"
"""Written last: what the export was made from; its presence marks the export complete."""

EXPORT_FORMAT = 1
"""Bumped when the mapping changes."""

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
    shared, tied = sharing(model)
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
    with weight_errors_as(ServingError):
        check_exportable(config, model.src_vocab_size, model.tgt_vocab_size, len(pieces))
    if len(set(pieces)) != len(pieces):
        raise ServingError(f"{spm_model} has repeated pieces: vocab.json cannot map them")
    generation = marian_generation_config(config, beam_size, alpha)
    with weight_errors_as(ServingError):
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
    with weight_errors_as(ServingError):
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
