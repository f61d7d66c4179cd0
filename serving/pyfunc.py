"""The registered "translator": an MLflow pyfunc around the ``Translator``.

A registered version holds the weights, the tokenizer folder, the model config (checked against
the checkpoint's own) and the decoding config as artifacts, and carries ``serving``,
``transformer_core`` and ``parsing`` (for tree-constrained decoding) as its code
(``code_paths``), nothing else of this project. It is logged as
code (``serving/registered_model.py``), so loading it runs that file and unpickles nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow.pyfunc

from serving.registered_version import (
    ARTIFACT_CTRANSLATE2,
    ARTIFACT_DECODE,
    ARTIFACT_LIMITS,
    ARTIFACT_MODEL_CONFIG,
    ARTIFACT_TOKENIZER,
    ARTIFACT_WEIGHTS,
)
from serving.scoring_protocol import (
    PARAMS,
    RequestError,
    RequestLimits,
    check_params,
    check_pieces,
    check_texts,
    piece_limit,
    predictions,
)
from serving.translator import DecodeConfig, Translator

if TYPE_CHECKING:
    from mlflow.models import ModelSignature
    from mlflow.pyfunc import PythonModelContext

N_BEST = "n_best"
"""A request's ``params`` may also ask for the n best translations (<= beam size) of each text:
then each text gets a list of ``{"translation", "score"}``, best first, instead of a string."""
REQUEST_PARAMS = tuple(name for name in PARAMS if name != N_BEST)
"""Decoding settings a request may change (``params``); the rest are the version's own."""
INPUT_EXAMPLE = ["A man is riding a bicycle ."]
"""What the registry shows as an example request (MLflow also runs it once when logging)."""


def signature(decode: DecodeConfig) -> ModelSignature:
    """Texts in, strings out, and the decoding settings a request may change, with this
    version's own as defaults. The input column is typed Any: MLflow turns a string column's
    null or 42 into "None" or "42" before ``predict`` sees them, and ``predict`` refuses what
    is not a string itself, naming its index."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    params = {name: getattr(decode, name) for name in REQUEST_PARAMS}
    params[N_BEST] = 1
    inferred = infer_signature(INPUT_EXAMPLE, ["Ein Mann fährt Fahrrad ."], params=params)
    return ModelSignature(
        inputs=Schema([ColSpec(AnyType())]), outputs=inferred.outputs, params=inferred.params
    )


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
        limits = artifacts.get(ARTIFACT_LIMITS)
        self._limits = RequestLimits.from_dict(
            json.loads(Path(limits).read_text()) if limits else {}
        )
        self._pieces = piece_limit(self._limits, self._translator.max_src_len)

    # No type hints on predict: MLflow would infer the signature from them and drop the
    # explicit one, whose params schema is what lets a request change the decoding. Input comes
    # as a list or, through the signature's one column, a one-column DataFrame.
    # (MLflow's own predict has no return annotation either, and its stub body reads as None.)
    def predict(self, context, model_input, params=None):  # pyrefly: ignore[bad-override]
        texts = model_input.iloc[:, 0].tolist() if hasattr(model_input, "iloc") else model_input
        try:  # the checks of `tfm serve` (serving.scoring_protocol), before anything decodes
            texts = check_texts(list(texts), self._limits)
            decoding = check_params(params or {}, self._translator.decode, self._limits)
            src_ids = self._translator.encode(texts)
            check_pieces(src_ids, self._pieces)
        except RequestError as exc:
            from mlflow.exceptions import MlflowException

            # MLflow's scoring server answers this error 400 with its message.
            raise MlflowException.invalid_parameter_value(str(exc)) from None
        return predictions(self._translator, src_ids, decoding)
