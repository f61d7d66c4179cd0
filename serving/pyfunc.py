"""The registered "translator": an MLflow pyfunc around the ``Translator``.

A registered version holds the weights, the tokenizer folder, the model config (checked against
the checkpoint's own) and the decoding config as artifacts, and carries ``serving`` and
``transformer_core`` as its code (``code_paths``), nothing else of this project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from serving.translator import DecodeConfig, Translator

# Names of the pyfunc's artifacts (keys of ``context.artifacts``).
ARTIFACT_WEIGHTS = "weights"
ARTIFACT_TOKENIZER = "tokenizer"
ARTIFACT_MODEL_CONFIG = "model_config"
ARTIFACT_DECODE = "decode"


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """The registered "translator": ``predict(list[str] | one-column DataFrame) -> list[str]``.

    Artifacts: ``weights`` (model.pt), ``tokenizer`` (a folder with spm.model),
    ``model_config`` (JSON, checked against the checkpoint's own) and ``decode`` (JSON).
    """

    def load_context(self, context: Any) -> None:
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
        )

    # The list[str] hint gives the model its signature (an array of strings), and MLflow turns
    # a one-column DataFrame into a list before calling this. `mlflow models serve` takes such
    # a model's input only as {"inputs": ["...", ...]} (dataframe_split is refused).
    def predict(
        self, context: Any, model_input: list[str], params: dict[str, Any] | None = None
    ) -> list[str]:
        return self._translator.translate([str(t) for t in model_input])
