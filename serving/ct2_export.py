"""A checkpoint as a CTranslate2 model folder that stands alone (the engine that decodes with it:
``serving.ct2``; CTranslate2's own ``translate_batch`` works as well).

The paper's Transformer is CTranslate2's ``TransformerSpec`` as it stands (ReLU feed-forward,
post-norm or, with ``norm_first``, pre-norm with final norms, embeddings times sqrt(d_model)), so
``export_ctranslate2`` copies our weights onto the spec one to one: q/k/v fused the way
CTranslate2 stores them, our sinusoid table written out as the position encodings (its own
table lays sines and cosines out in halves, ours interleaves them), torch's layer-norm epsilon.
The vocabulary is the sentencepiece model's pieces in id order, ``<pad>`` included, so every
CTranslate2 id is our id and its decoder start token ``<s>`` is our BOS; CTranslate2 appends
EOS to every source (``add_source_eos``), so its users pass the sentencepiece pieces alone.

Beside the model the folder holds the tokenizer files (``serving.tokenizer.FILES``: the
sentencepiece model, and any lowercasing, Moses and subword-nmt settings) and, in
``export.json``, ``translate_batch``: the keyword arguments of
``ctranslate2.Translator.translate_batch`` that decode as the pipeline does
(``serving.ct2_options.translate_batch_options``), next to the pipeline's own settings
(``decoding``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving import ServingError
from serving.ct2_options import QUANTIZATIONS, translate_batch_options
from serving.decode_config import DecodeConfig
from serving.tokenizer import FILES as TOKENIZER_FILES
from transformer_core.config import ModelConfig
from transformer_core.config_checks import ConfigError
from transformer_core.folders import (
    publish,
    remove_stale_temporaries,
    sha256_file,
    temporary_sibling,
    write_json_atomic,
)
from transformer_core.search_settings import beam_fields
from transformer_core.special_ids import UNK_ID

if TYPE_CHECKING:
    from transformer_core.model import Transformer

__all__ = [
    "QUANTIZATIONS",
    "default_export_dir",
    "export_ctranslate2",
    "read_info",
    "require",
    "save_model",
]

INFO_FILE = "export.json"
"""Written last into an export: what it was made from; its presence marks the export complete."""

EXPORT_FORMAT = 2
"""Bumped when the mapping changes, so that older exports are rebuilt rather than reused
(2: the tokenizer files, ``translate_batch`` and CTranslate2 appending EOS to the sources)."""

LAYER_NORM_EPS = 1e-5
"""torch.nn.LayerNorm's default; CTranslate2's own default is 1e-6."""


def check_quantization(quantization: str) -> None:
    """ConfigError naming ``quantization`` unless CTranslate2 can store it."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            "quantization", f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
        )


def check_exportable(config: ModelConfig) -> None:
    """ServingError for the configs CTranslate2's spec cannot hold (different d_k and d_v)."""
    if config.head_dim_k != config.head_dim_v:
        raise ServingError(
            f"d_k={config.head_dim_k} differs from d_v={config.head_dim_v}: CTranslate2's "
            "attention has one head width; use engine torch for this model"
        )


def build_spec(model: Transformer, pieces: Sequence[str]) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and ``pieces`` as
    source and target vocabulary (``pieces[i]`` is token id i)."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config)
    for name, size in (("source", model.src_vocab_size), ("target", model.tgt_vocab_size)):
        if size != len(pieces):
            raise ServingError(
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
    weights = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    positions = _positions(model)
    _set_encoder(spec.encoder, weights, positions, config)
    _set_decoder(spec.decoder, weights, positions, config)
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    return spec


def _positions(model: Transformer) -> Any:
    # Ours, written out: CTranslate2's built-in sinusoids are laid out differently.
    if model.config.positional == "learned":
        return model.pos_embed.weight.detach().float().cpu()
    return model.pos_table.float().cpu()


def _set_encoder(spec: Any, w: dict, positions: Any, config: ModelConfig) -> None:
    spec.embeddings[0].weight = w["src_embed.weight"]
    spec.position_encodings.encodings = positions
    if config.norm_first:
        _set_norm(spec.layer_norm, w, "encoder_norm")
    for i, layer in enumerate(spec.layer):
        p = f"encoder_layers.{i}"
        _set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_ffn(layer.ffn, w, p)
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm2")


def _set_decoder(spec: Any, w: dict, positions: Any, config: ModelConfig) -> None:
    spec.embeddings.weight = w["tgt_embed.weight"]
    spec.position_encodings.encodings = positions
    spec.projection.weight = w["generator.weight"]
    if config.norm_first:
        _set_norm(spec.layer_norm, w, "decoder_norm")
    for i, layer in enumerate(spec.layer):
        p = f"decoder_layers.{i}"
        _set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_cross_attention(layer.attention, w, f"{p}.cross_attn")
        _set_norm(layer.attention.layer_norm, w, f"{p}.norm2")
        _set_ffn(layer.ffn, w, p)
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm3")


def _set_self_attention(spec: Any, w: dict, prefix: str) -> None:
    # CTranslate2 stores self-attention's q, k, v as one fused projection.
    _set_linear(spec.linear[0], w, [f"{prefix}.{n}" for n in ("q_proj", "k_proj", "v_proj")])
    _set_linear(spec.linear[1], w, [f"{prefix}.out_proj"])


def _set_cross_attention(spec: Any, w: dict, prefix: str) -> None:
    # Queries from the decoder; keys and values (fused) from the encoder output.
    _set_linear(spec.linear[0], w, [f"{prefix}.q_proj"])
    _set_linear(spec.linear[1], w, [f"{prefix}.k_proj", f"{prefix}.v_proj"])
    _set_linear(spec.linear[2], w, [f"{prefix}.out_proj"])


def _set_ffn(spec: Any, w: dict, prefix: str) -> None:
    _set_linear(spec.linear_0, w, [f"{prefix}.ffn.w1"])
    _set_linear(spec.linear_1, w, [f"{prefix}.ffn.w2"])


def _set_linear(spec: Any, w: dict, names: list[str]) -> None:
    import torch

    spec.weight = torch.cat([w[f"{n}.weight"] for n in names])
    spec.bias = torch.cat([w[f"{n}.bias"] for n in names])


def _set_norm(spec: Any, w: dict, name: str) -> None:
    spec.gamma = w[f"{name}.weight"]
    spec.beta = w[f"{name}.bias"]


def save_model(
    model: Transformer,
    pieces: Sequence[str],
    out: Path,
    quantization: str = "float32",
    identity: dict[str, Any] | None = None,
    *,
    decode: DecodeConfig | None = None,
    tokenizer_dir: Path | None = None,
) -> Path:
    """Write ``model`` as a CTranslate2 model folder ``out`` through a temporary sibling renamed
    into place, with ``tokenizer_dir``'s tokenizer files; ``export.json`` holds ``identity``
    (what it was made from), the config, and ``decode``'s settings as ``translate_batch``."""
    import ctranslate2

    check_quantization(quantization)
    out = Path(out)
    spec = build_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    files = _tokenizer_files(tokenizer_dir)
    info = {
        **(identity or {}),
        **_decoding(model.config, pieces, decode or DecodeConfig()),
        "format": EXPORT_FORMAT,
        "ctranslate2": ctranslate2.__version__,
        "quantization": quantization,
        "model_config": model.config.to_dict(),
        "vocab_size": len(pieces),
        "tokenizer_files": sorted(path.name for path in files),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = temporary_sibling(out)
    try:
        tmp.mkdir()
        spec.save(str(tmp))
        for path in files:
            shutil.copy2(path, tmp / path.name)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        publish(tmp, out, already=lambda folder: read_info(folder) == info)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _decoding(config: ModelConfig, pieces: Sequence[str], decode: DecodeConfig) -> dict[str, Any]:
    """``export.json``'s account of decoding: the pipeline's settings, and the keyword arguments
    of CTranslate2's ``translate_batch`` that reproduce them."""
    options = translate_batch_options(decode, config, pieces, decode.max_tokens_per_batch)
    return {"decoding": beam_fields(decode), "translate_batch": options}


def _tokenizer_files(folder: Path | None) -> list[Path]:
    """The tokenizer files ``folder`` holds (none without a folder)."""
    if folder is None:
        return []
    return [Path(folder) / name for name in TOKENIZER_FILES if (Path(folder) / name).is_file()]


def read_info(folder: Path) -> dict[str, Any] | None:
    """The ``export.json`` of a complete export in ``folder``, else None."""
    path = Path(folder) / INFO_FILE
    if not path.is_file() or not (Path(folder) / "model.bin").is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def export_ctranslate2(
    checkpoint: Path,
    tokenizer_dir: Path,
    out: Path,
    quantization: str = "float32",
    decode: DecodeConfig | None = None,
) -> Path:
    """Export ``checkpoint`` (a model.pt or a folder holding one) with ``tokenizer_dir``'s
    tokenizer as a CTranslate2 model folder ``out`` that decodes with ``decode``'s settings (by
    default, ``DecodeConfig``'s); a complete export of the same checkpoint, tokenizer and
    quantization already there is reused (``_reused``). Returns ``out``."""
    from serving import tokenizer as tokenizer_lib
    from transformer_core import checkpoint as checkpoint_lib
    from transformer_core.checkpoint import model_file

    check_quantization(quantization)
    require()
    checkpoint, out, decode = model_file(checkpoint), Path(out), decode or DecodeConfig()
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    tok = tokenizer_lib.load(Path(tokenizer_dir))
    identity = {
        "checkpoint_sha256": sha256_file(checkpoint),
        "tokenizer_sha256": _digest(_tokenizer_files(Path(tokenizer_dir))),
    }
    pieces = [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]
    if _reused(out, identity, quantization, decode, pieces):
        return out
    model = checkpoint_lib.load_model(checkpoint, map_location="cpu")
    return save_model(
        model, pieces, out, quantization, identity, decode=decode, tokenizer_dir=tokenizer_dir
    )


def _digest(files: Sequence[Path]) -> str:
    """One sha256 over the files' names and contents."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def _reused(
    out: Path,
    identity: dict[str, Any],
    quantization: str,
    decode: DecodeConfig,
    pieces: Sequence[str],
) -> bool:
    """Whether ``out`` is a complete export of the same weights (checkpoint, tokenizer,
    quantization, CTranslate2 version); if only the decoding settings differ, its
    ``export.json`` is rewritten to say ``decode``'s, as converting the weights again would."""
    import ctranslate2

    info = read_info(out)
    if info is None:
        return False
    want = {
        **identity,
        "format": EXPORT_FORMAT,
        "ctranslate2": ctranslate2.__version__,
        "quantization": quantization,
    }
    if any(info.get(k) != v for k, v in want.items()):
        return False
    decoding = _decoding(ModelConfig.from_dict(info["model_config"]), pieces, decode)
    if any(info.get(k) != v for k, v in decoding.items()):
        write_json_atomic(out / INFO_FILE, {**info, **decoding})
    return True


def default_export_dir(checkpoint: Path, quantization: str = "float32") -> Path:
    """Where the engine keeps a checkpoint's export: ``<dir>/<stem>.ct2-<quantization>`` next to
    the checkpoint file (``average/model.ct2-float32`` for the average stage's model.pt)."""
    from transformer_core.checkpoint import model_file

    checkpoint = model_file(checkpoint)
    return checkpoint.with_name(f"{checkpoint.stem}.ct2-{quantization}")


def require() -> None:
    """ServingError unless the ctranslate2 package is installed."""
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is None:
        raise ServingError(
            "decode.engine ctranslate2 needs the ctranslate2 package "
            "(pip install 'attention-pipeline[serve]')"
        )
