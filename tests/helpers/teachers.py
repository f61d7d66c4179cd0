"""A registered teacher for the distill pipeline's tests, made in seconds: a debug-size model
with random weights (its outputs are long and never empty, and cost no training) and a tiny
tokenizer, registered as the register stage registers a model, in a SQLite registry."""

from __future__ import annotations

from pathlib import Path

from helpers.flow_configs import tiny_config
from helpers.stage_folders import tiny_sentences, tokenizer_folder

TEACHER = "flowtest"
"""The teacher's registered name: what ``flow_configs.distill_config`` asks for."""


def register_teacher(root: Path, seed: int = 0) -> str:
    """Register a new version of ``TEACHER`` (made from ``seed``) in the registry under
    ``root``, without the weights' sha256 tag (as versions registered before the tag); the
    registry's tracking URI. Its sacreBLEU is ``seed``: a later seed takes the champion alias."""
    import torch

    from tasks.framework.config import config_from_dict
    from tasks.register import register_model
    from transformer_core import checkpoint, presets
    from transformer_core.model import Transformer

    config = config_from_dict(tiny_config(root, name="teacher", **{"register.model_name": TEACHER}))
    made = root / f"teacher-{seed}"
    tokenizer = tokenizer_folder(made / "tokenizer", tiny_sentences(300, seed=0), 64)
    torch.manual_seed(seed)
    model_config = presets.debug().replace(max_len=256)
    weights = made / "model.pt"
    checkpoint.save(weights, Transformer(model_config, 64), model_config, vocab_size=64)
    scores = {"bleu_sacre": float(seed), "test_set": "synthetic", "test_variant": "synthetic"}
    scores = {**scores, "pair": "en-de", "signature": "s"}
    # The scores as tags, as register sets them: the next version's champion decision reads them.
    register_model(config, weights, tokenizer, scores, {k: str(v) for k, v in scores.items()})
    return config.tracking_uri
