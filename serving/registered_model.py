"""The registered translator's code, logged with MLflow's models-from-code: loading a registered
version runs this file (from the version's own copy of ``serving``), and unpickles nothing."""

import mlflow

from serving.pyfunc import TranslatorModel

mlflow.models.set_model(TranslatorModel())
