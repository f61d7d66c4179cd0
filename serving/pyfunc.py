"""The registered "translator": an MLflow pyfunc around the ``Translator``.

A registered version holds the weights, the tokenizer folder, the model config (checked against
the checkpoint's own) and the decoding config as artifacts, and carries ``serving``,
``transformer_core`` and ``parsing`` (for tree-constrained decoding) as its code
(``code_paths``), nothing else of this project. It is logged as
code (``serving/registered_model.py``), so loading it runs that file and unpickles nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow.pyfunc

from serving.translator import DecodeConfig, Translator

if TYPE_CHECKING:
    from mlflow.models import ModelSignature
    from mlflow.pyfunc import PythonModelContext

REQUEST_PARAMS = ("beam_size", "alpha", "length_norm", "max_len_offset")
"""Decoding settings a request may change (``params``); the rest are the version's own."""
N_BEST = "n_best"
"""A request's ``params`` may also ask for the n best translations (<= beam size) of each text:
then each text gets a list of ``{"translation", "score"}``, best first, instead of a string."""
INPUT_EXAMPLE = ["A man is riding a bicycle ."]
"""What the registry shows as an example request (MLflow also runs it once when logging)."""


def signature(decode: DecodeConfig) -> ModelSignature:
    """Strings in, strings out, and the decoding settings a request may change, with this
    version's own as defaults."""
    from mlflow.models import infer_signature

    params = {name: getattr(decode, name) for name in REQUEST_PARAMS}
    params[N_BEST] = 1
    return infer_signature(INPUT_EXAMPLE, ["Ein Mann fährt Fahrrad ."], params=params)


# Names of the pyfunc's artifacts (keys of ``context.artifacts``).
ARTIFACT_WEIGHTS = "weights"
ARTIFACT_TOKENIZER = "tokenizer"
ARTIFACT_MODEL_CONFIG = "model_config"
ARTIFACT_DECODE = "decode"
ARTIFACT_CTRANSLATE2 = "ctranslate2"
"""With decode.engine ctranslate2: the CTranslate2 export of the weights, made at registration."""
WEIGHTS_TAG = "weights_sha256"
"""The registry tag of every version: its weights file's sha256 (what a distillation run pins its
teacher by, without downloading it)."""


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """The registered "translator": ``predict(list[str] | one-column DataFrame) -> list[str]``.

    Artifacts: ``weights`` (model.pt), ``tokenizer`` (a folder with spm.model),
    ``model_config`` (JSON, checked against the checkpoint's own) and ``decode`` (JSON).
    """

    def load_context(self, context: PythonModelContext) -> None:
        from transformer_core.config import ModelConfig

        artifacts = context.artifacts
        decode = DecodeConfig.from_dict(json.loads(Path(artifacts[ARTIFACT_DECODE]).read_text()))
        model_config = ModelConfig.from_dict(
            json.loads(Path(artifacts[ARTIFACT_MODEL_CONFIG]).read_text())
        )
        self._translator = Translator.load(
            artifacts[ARTIFACT_WEIGHTS],
            artifacts[ARTIFACT_TOKENIZER],
            decode,
            expected_config=model_config,
            export_dir=artifacts.get(ARTIFACT_CTRANSLATE2),
        )

    # No type hints on predict: MLflow would infer the signature from them and drop the
    # explicit one, whose params schema is what lets a request change the decoding. Input comes
    # as a list or, through the signature's column of strings, a one-column DataFrame.
    # (MLflow's own predict has no return annotation either, and its stub body reads as None.)
    def predict(self, context, model_input, params=None):  # pyrefly: ignore[bad-override]
        texts = model_input.iloc[:, 0] if hasattr(model_input, "iloc") else model_input
        translator = self._translator
        params = params or {}
        changes = {k: v for k, v in params.items() if k in REQUEST_PARAMS and v is not None}
        if changes:  # this request's decoding; the loaded model and tokenizer are shared
            decode = dataclasses.replace(translator.decode, **changes)
            translator = Translator(
                translator.model, translator.tokenizer, decode, translator.device
            )
        n_best = int(params.get(N_BEST) or 1)
        if n_best > 1:
            found = translator.translate_nbest([str(t) for t in texts], n_best)
            return [[{"translation": t, "score": score} for t, score in hyps] for hyps in found]
        return translator.translate([str(t) for t in texts])
