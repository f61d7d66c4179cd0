"""A checkpoint as a CTranslate2 model folder that stands alone (the engine that decodes with it:
``serving.ct2``; CTranslate2's own ``translate_batch`` works as well).

The weights go onto CTranslate2's ``TransformerSpec`` one to one
(``weight_adapters.ctranslate2``). The vocabulary is the sentencepiece model's pieces in id
order, ``<pad>`` included, so every CTranslate2 id is our id and its decoder start token ``<s>``
is our BOS; CTranslate2 appends EOS to every source (``add_source_eos``), so its users pass the
sentencepiece pieces alone.

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


def check_quantization(quantization: str) -> None:
    """ConfigError naming ``quantization`` unless CTranslate2 can store it."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            "quantization", f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
        )


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

    # Here, not at the top: a registered model's engine (serving.ct2) reads exports and writes
    # none, and carries serving, transformer_core and parsing only.
    from weight_adapters import weight_errors_as
    from weight_adapters.ctranslate2 import build_spec

    check_quantization(quantization)
    out = Path(out)
    with weight_errors_as(ServingError):
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
