"""The rules of a run that starts from a trained model (``train.init_from``): a registered
model's URI or a folder, in a pipeline that trains, whose tokenizer is the parent's."""

from __future__ import annotations

from corpora.subwords import TokenizerConfig
from tasks.framework.config_sections import ModelReference
from training.config import TrainConfig
from transformer_core.config_checks import ConfigError


def check_init_from(train: TrainConfig, tokenizer: TokenizerConfig, pipeline: str) -> None:
    """A ConfigError naming the key for an ``init_from`` that cannot be a parent here: in the
    fairseq pipeline, a ``models:`` URI that is not one, beside ``tokenizer.model_file``; and for
    a ``tokenizer.model_file`` in the fairseq pipeline, which brings its own."""
    if pipeline == "fairseq" and tokenizer.model_file is not None:
        raise ConfigError(
            "tokenizer.model_file",
            "the fairseq pipeline takes the imported checkpoint's dictionary and codes (tfm "
            "import fairseq): leave it out",
        )
    parent = train.init_from
    if parent is None:
        return
    if pipeline == "fairseq":
        raise ConfigError("train.init_from", "the fairseq pipeline imports a model, it trains none")
    if parent.startswith("models:"):
        try:
            ModelReference.parse(parent)
        except ValueError as exc:
            raise ConfigError("train.init_from", str(exc)) from None
    if tokenizer.model_file is not None:
        raise ConfigError(
            "tokenizer.model_file",
            "is not used with train.init_from: the parent's tokenizer is the one (its "
            "embeddings mean its pieces); leave one of them out",
        )
