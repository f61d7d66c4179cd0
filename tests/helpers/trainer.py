"""A Trainer without Ray on a tiny reversal task (vocabulary 12): the settings, the model and
the data that the trainer, checkpoint, elastic and prefetch tests share."""

from __future__ import annotations

import io

import numpy as np
import torch

from training.config import TrainConfig
from training.data import BatchStream, TokenData
from training.trainer import Trainer
from transformer_core import EOS_ID, Transformer, presets

VOCAB = 12  # 4 special ids + 8 symbols
SEED = 3


def reversal_rows(
    n: int, seed: int, vocab: int = VOCAB, shortest: int = 3, longest: int = 8
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The reversal task, the one every test trains on: ``n`` rows of src = ``shortest`` to
    ``longest`` symbols (ids 4 to ``vocab`` - 1) + EOS, tgt = the symbols reversed + EOS."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        symbols = rng.integers(4, vocab, size=int(rng.integers(shortest, longest + 1)))
        src.append(np.r_[symbols, EOS_ID])
        tgt.append(np.r_[symbols[::-1], EOS_ID])
    return src, tgt


def reversal(n: int, seed: int, longest: int = 8) -> TokenData:
    """``reversal_rows`` of the trainer's vocabulary in the CSR layout the Trainer reads."""
    sides = []
    for rows in reversal_rows(n, seed, longest=longest):
        offsets = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
        sides += [np.concatenate(rows).astype(np.uint16), offsets]
    return TokenData(*sides)


SETTINGS = {
    "steps": 8,
    "tokens_per_step": 160,  # 2 micro-batches of 80 padded tokens per step
    "max_tokens_per_batch": 80,
    "warmup_steps": 10,
    "lr_scale": 0.15,  # the paper's rate at d_model 64 is high enough to collapse the encoder
    "eval_every": 4,
    "checkpoint_every": 3,
    "checkpoint_minutes": 0.0,
    "log_every": 1,
}


def settings(**changes) -> TrainConfig:
    return TrainConfig(**{**SETTINGS, **changes})


def make_trainer(config: TrainConfig, init_seed: int = SEED, **kwargs) -> Trainer:
    torch.manual_seed(init_seed)
    module = Transformer(presets.debug().replace(max_len=32), VOCAB)  # dropout 0.1: RNG matters
    return Trainer(module, config, reversal(96, 1), reversal(16, 2), seed=SEED, **kwargs)


def as_checkpoint(state: dict) -> dict:
    """What a checkpoint file gives back: a copy, loadable with ``weights_only=True``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def consumed(trainer, steps: int) -> list[np.ndarray]:
    """The global batches (every rank's) of the next ``steps`` steps, from the Trainer's stream."""
    batches: list[np.ndarray] = []
    for _ in range(steps):
        before = trainer.prefetcher.position
        trainer.train_step()
        replay = BatchStream(
            trainer.train_data, trainer.config.max_tokens_per_batch, SEED, **before
        )
        batches += replay.take(trainer.per_step)
    return batches
