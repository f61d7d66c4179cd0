"""serving: what a trained model needs to translate text, and all that a registered model
carries besides ``transformer_core``: the tokenizer, the ``Translator``, the MLflow pyfunc and
the stream translation behind ``tfm translate``."""


class ServingError(RuntimeError):
    """A model or tokenizer that cannot be loaded or used; the message says which and why."""
