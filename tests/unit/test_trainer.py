"""The Trainer without Ray: exact resume from its state dict, the paper's schedule, learning."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from training.config import TrainConfig
from training.data import TokenData
from training.distributed import seed_all
from training.trainer import Trainer
from transformer_core import EOS_ID, Transformer, presets
from transformer_core.schedule import learning_rate

VOCAB = 12  # 4 special ids + 8 symbols
SEED = 3


@pytest.fixture(autouse=True)
def one_thread():
    # Two shared cores: oversubscribed intra-op threads slow these CPU-bound tests down.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reversal(n: int, seed: int) -> TokenData:
    """``n`` rows of src = symbols + EOS, tgt = the symbols reversed + EOS (CSR layout)."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        symbols = rng.integers(4, VOCAB, size=int(rng.integers(3, 9)))
        src.append(np.r_[symbols, EOS_ID])
        tgt.append(np.r_[symbols[::-1], EOS_ID])
    sides = []
    for rows in (src, tgt):
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


def run(trainer: Trainer, steps: int) -> list[dict[str, float]]:
    return [trainer.train_step() for _ in range(steps)]


def as_checkpoint(state: dict) -> dict:
    """What a checkpoint file gives back: a copy, loadable with ``weights_only=True``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_resume_continues_bit_identically():
    config = settings()
    straight = make_trainer(config)
    trace = run(straight, 6)

    first = make_trainer(config)
    before = run(first, 3)
    state = as_checkpoint(first.state_dict())
    torch.manual_seed(999)  # a new process: other RNG states, other initial weights
    np.random.seed(999)
    resumed = make_trainer(config, init_seed=999)
    resumed.load_state_dict(state)
    assert resumed.step == resumed.start_step == 3
    after = run(resumed, 3)

    keys = ("loss", "nll", "lr", "grad_norm", "epoch", "batch_index")
    assert [{k: m[k] for k in keys} for m in before + after] == [
        {k: m[k] for k in keys} for m in trace
    ]
    expected = straight.module.state_dict()
    for name, value in resumed.module.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)


def test_rng_is_restored_or_rederived_for_another_world_size():
    trainer = make_trainer(settings())
    run(trainer, 2)
    state = as_checkpoint(trainer.state_dict())
    make_trainer(settings()).load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), state["rng"]["torch"])

    make_trainer(settings()).load_state_dict({**state, "world_size": 4})
    restored = torch.get_rng_state()
    seed_all(SEED + 2, 0)  # fresh per-rank streams derived from (seed + step, rank)
    assert torch.equal(restored, torch.get_rng_state())


def test_learning_rate_follows_the_paper_at_every_step():
    config = settings(steps=10, warmup_steps=4, lr_scale=0.5)
    trainer = make_trainer(config)
    d_model = trainer.module.config.d_model
    for step in range(1, 11):
        metrics = trainer.train_step()
        assert metrics["lr"] == learning_rate(step, d_model, 4, 0.5)
        # the optimizer already holds the next step's rate
        assert trainer.optimizer.param_groups[0]["lr"] == learning_rate(step + 1, d_model, 4, 0.5)


def test_logging_evaluation_checkpoints_and_callbacks_follow_the_config():
    seen = []
    config = settings(steps=7, stop_after=7, log_every=3, eval_every=4, checkpoint_every=3)
    trainer = make_trainer(config, callbacks=[lambda t: seen.append(t.step)])
    saved = []
    logged, evaluated = [], []
    while trainer.step < trainer.last_step:
        if trainer.train_step():
            logged.append(trainer.step)
        if trainer.maybe_evaluate():
            evaluated.append(trainer.step)
        trainer.maybe_checkpoint(saved.append)
    assert seen == list(range(1, 8))
    assert logged == [3, 6, 7] and evaluated == [4, 7]
    assert [m["step"] for m in saved] == [3, 6, 7]
    expected = {"time", "train_seconds", "epoch", "index", "loss", "val_loss", "val_encoder_spread"}
    assert expected <= set(saved[-1])


def test_loss_falls_on_a_learnable_task():
    config = settings(steps=100)
    trainer = make_trainer(config)
    losses = [m["loss"] for m in run(trainer, 100)]
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < first - 0.4, (first, last)
    untrained = make_trainer(config).evaluate()["val_loss"]
    assert trainer.evaluate()["val_loss"] < untrained - 0.3
