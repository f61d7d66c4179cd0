"""``tfm export``: a checkpoint, or a registered version, as a CTranslate2 model folder
(``serving.ct2_export``) or a Hugging Face Marian folder (``serving.marian_export``)."""

from __future__ import annotations

from pathlib import Path

from serving import ServingError
from serving.decode_config import DecodeConfig

__all__ = ["TARGETS", "export", "registered_files"]

TARGETS = ("ctranslate2", "marian")


def registered_files(
    model_uri: str, dst: Path, tracking_uri: str | None = None
) -> tuple[Path, Path, DecodeConfig]:
    """Download a registered version into ``dst``; its weights file, tokenizer folder and
    decoding settings."""
    from serving.registered_version import download

    files = download(model_uri, dst, tracking_uri)
    return files.weights, files.tokenizer, files.decode


def export(
    target: str,
    checkpoint: Path,
    tokenizer_dir: Path,
    out: Path,
    quantization: str = "float32",
    decode: DecodeConfig | None = None,
) -> Path:
    """Write ``out`` for ``target`` (ctranslate2 or marian); returns it. A CTranslate2 export
    says how to decode as ``decode`` does (default: ``DecodeConfig``'s settings)."""
    if target == "ctranslate2":
        from serving.ct2_export import export_ctranslate2

        return export_ctranslate2(checkpoint, tokenizer_dir, out, quantization, decode)
    if target == "marian":
        if quantization != "float32":
            raise ServingError(f"--quantization {quantization}: a Marian export is float32")
        _check_marian_tokenizer(tokenizer_dir)
        from serving.marian_export import export_marian

        return export_marian(checkpoint, tokenizer_dir, out)
    raise ServingError(f"export target {target!r} is not one of {', '.join(TARGETS)}")


def _check_marian_tokenizer(tokenizer_dir: Path) -> None:
    """MarianTokenizer applies the sentencepiece model only: a folder that also lowercases or
    Moses-tokenizes (``corpora.pretokenize``) would be served different text than it was trained
    on."""
    from serving.tokenizer import load

    pretokenizer = load(Path(tokenizer_dir)).pretokenizer
    if pretokenizer:
        raise ServingError(
            f"{tokenizer_dir} pretokenizes its text ({pretokenizer.description}), "
            "which MarianTokenizer cannot: export --target ctranslate2, "
            "or serve the registered MLflow model"
        )
