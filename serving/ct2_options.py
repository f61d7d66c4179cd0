"""Our decoding in CTranslate2's terms: the weight types it stores (``Quantization``) and computes
in (``ComputeType``), and the keyword arguments of ``ctranslate2.Translator.translate_batch``
that reproduce a search's settings (every export writes them into its ``export.json``, for users
of CTranslate2's own API).

CTranslate2 ranks a finished hypothesis by its summed log-probability / |Y|^p (|Y| counting the
EOS, as ours): fairseq's penalty is that form (p = alpha); GNMT's is not a power of |Y|, and
ranks near a length L as |Y|^p with p its local slope
(``transformer_core.search_settings.penalty_exponent``: the engine's, per batch, before it
re-ranks by GNMT's penalty exactly). An export cannot know its users' lengths, so its options
carry the slope fitted over the lengths 1..100 (``fitted_penalty_exponent``, as the Marian
export's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from transformer_core.config import ModelConfig
from transformer_core.search_settings import BeamSettings, fitted_penalty_exponent

__all__ = [
    "COMPUTE_TYPES",
    "QUANTIZATIONS",
    "ComputeType",
    "ct2_exponent",
    "min_length",
    "Quantization",
    "suppressed",
    "translate_batch_options",
]

Quantization = Literal[
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
]
"""Weight types CTranslate2 can store (``ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES``)."""
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)

ComputeType = Literal["default", "auto", Quantization]
"""What ``ctranslate2.Translator(compute_type=...)`` accepts: "default" keeps the stored type
(or the nearest one the device supports), "auto" picks the fastest the device supports."""
COMPUTE_TYPES: tuple[str, ...] = get_args(ComputeType)

MIN_EXPONENT = 1e-6
"""The smallest length_penalty passed to CTranslate2 (``ct2_exponent``)."""


def ct2_exponent(p: float) -> float:
    """``p`` as CTranslate2's length_penalty: never 0, with which CTranslate2 stops a sentence
    once its top beam ends, not after k finished hypotheses as our search does."""
    return max(p, MIN_EXPONENT)


def min_length(settings: BeamSettings) -> int:
    """CTranslate2's ``min_decoding_length`` for ``settings``: 1 with ``length_rule`` fairseq
    (EOS never first), else 0 (an empty output allowed, as our search allows it)."""
    return 1 if settings.length_rule == "fairseq" else 0


def suppressed(config: ModelConfig, pieces: Sequence[str]) -> list[list[str]]:
    """PAD and BOS as ``suppress_sequences``: our search never produces them either."""
    return [[pieces[config.pad_id]], [pieces[config.bos_id]]]


def translate_batch_options(
    settings: BeamSettings, config: ModelConfig, pieces: Sequence[str], batch_tokens: int = 0
) -> dict[str, Any]:
    """The keyword arguments of ``translate_batch`` that decode as our search with ``settings``:
    its beam, its length penalty (``fitted_penalty_exponent``), an empty output allowed as
    ours allows it (``min_length``), PAD and BOS never produced, sources cut and outputs
    capped at the model's ``max_len`` (CTranslate2 has one output limit per call, not source
    length + ``max_len_offset``), and, with ``batch_tokens``, the sources sorted and batched by
    length as the translator does."""
    p = fitted_penalty_exponent(settings.alpha, settings.length_norm)
    options: dict[str, Any] = {
        "beam_size": settings.beam_size,
        "length_penalty": ct2_exponent(p),
        "min_decoding_length": min_length(settings),
        "max_decoding_length": config.max_len,
        # Counts the EOS CTranslate2 appends: max_len - 1 pieces, as the translator cuts them.
        "max_input_length": config.max_len,
        "suppress_sequences": suppressed(config, pieces),
    }
    if batch_tokens:
        options |= {"max_batch_size": batch_tokens, "batch_type": "tokens"}
    return options
