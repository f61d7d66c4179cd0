"""Static shapes (``train.static_shapes``): the bucket grid, the padding it adds, and a Trainer
on padded batches training as on the batches themselves (the CUDA graphs are in tests/gpu)."""

from __future__ import annotations

import pytest
import torch
from helpers.trainer import VOCAB, reversal

from training.config import TrainConfig
from training.static_shapes import bucket, pad_to_bucket
from training.trainer import Trainer
from transformer_core import BOS_ID, EOS_ID, PAD_ID, Transformer, presets
from transformer_core.batching import collate
from transformer_core.config_checks import ConfigError
from transformer_core.loss import label_smoothed_nll


def test_buckets_are_multiples_of_eight_with_at_most_an_eighth_added():
    sizes = [bucket(n) for n in range(1, 3000)]
    assert sizes == sorted(sizes)  # monotone: a longer batch never gets a smaller bucket
    for n, size in zip(range(1, 3000), sizes, strict=True):
        assert size >= n and size % 8 == 0
        assert size <= max(8, n * 9 / 8 + 1e-9) or size - n < 8, (n, size)
    # few shapes: 8 sizes per doubling above 64
    assert len({bucket(n) for n in range(65, 129)}) == 8
    assert len({bucket(n) for n in range(1025, 2049)}) == 8


def test_a_length_bucket_never_passes_the_model_positions():
    assert bucket(250, limit=256) == 256
    assert bucket(300, limit=256) == 300  # over the limit already: the model refuses it, not us
    assert bucket(31, limit=32) == 32


def test_padding_keeps_the_rows_and_adds_rows_that_add_nothing_to_the_loss():
    rows_src = [[5, 6, 7, EOS_ID], [8, EOS_ID]] * 5  # 10 rows, bucket 16
    rows_tgt = [[9, 10, EOS_ID], [11, 4, 5, 6, 7, 8, 9, 10, 11, EOS_ID]] * 5
    src, tgt_in, tgt_out = collate(rows_src, rows_tgt, PAD_ID, BOS_ID)
    ids = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    p_src, p_in, p_out = pad_to_bucket(src, tgt_in, tgt_out, max_len=32, **ids)
    assert p_src.shape == (16, 8) and p_in.shape == p_out.shape == (16, 16)
    assert torch.equal(p_src[:10, :4], src) and torch.equal(p_out[:10, :10], tgt_out)
    assert torch.equal(p_in[:10, :10], tgt_in)
    assert (p_src[10:, 0] == EOS_ID).all() and (p_src[10:, 1:] == PAD_ID).all()
    assert (p_in[10:, 0] == BOS_ID).all() and (p_out[10:] == PAD_ID).all()
    assert (p_src[:10, 4:] == PAD_ID).all() and (p_out[:10, 10:] == PAD_ID).all()

    # The padded batch's loss and gradient are the batch's own (no dropout: no draws).
    torch.manual_seed(0)
    model = Transformer(presets.debug().replace(max_len=32, dropout=0.0), VOCAB)
    grads = []
    for batch in ((src, tgt_in, tgt_out), (p_src, p_in, p_out)):
        model.zero_grad()
        loss, nll, n = label_smoothed_nll(model(batch[0], batch[1]), batch[2], 0.1, PAD_ID)
        loss.backward()
        grads.append((loss.detach(), int(n), [p.grad.clone() for p in model.parameters()]))
    assert grads[1][1] == grads[0][1] == int((tgt_out != PAD_ID).sum())
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6)
    for padded, plain in zip(grads[1][2], grads[0][2], strict=True):
        torch.testing.assert_close(padded, plain, rtol=1e-4, atol=1e-5)  # summation order


def test_training_on_bucketed_batches_gives_the_eager_losses_and_weights():
    settings = {
        "steps": 6,
        "tokens_per_step": 160,
        "max_tokens_per_batch": 80,
        "warmup_steps": 10,
        "lr_scale": 0.15,
        "eval_every": 100,
        "checkpoint_every": 0,
        "checkpoint_minutes": 0.0,
        "log_every": 1,
        "merge_micro_batches": True,
        "prefetch": 0,
        "clip_norm": 1.0,
    }

    def trainer(static: bool) -> Trainer:
        torch.manual_seed(3)
        module = Transformer(presets.debug().replace(max_len=32, dropout=0.0), VOCAB)
        config = TrainConfig(**settings, static_shapes=static)
        return Trainer(
            module, config, reversal(120, 1, longest=11), reversal(16, 2, longest=11), seed=3
        )

    plain, padded = trainer(False), trainer(True)
    shapes = {tuple(t.shape) for t in padded.prefetcher.next()[1][0]}
    assert all(size % 8 == 0 for shape in shapes for size in shape)
    plain, padded = trainer(False), trainer(True)
    a, b = [plain.train_step() for _ in range(6)], [padded.train_step() for _ in range(6)]
    # The same sums over other shapes: float32 rounding apart, the same losses (stated: 1e-5).
    for key in ("loss", "nll", "grad_norm"):
        assert [m[key] for m in b] == pytest.approx([m[key] for m in a], rel=1e-5), key
    for name, weight in plain.module.state_dict().items():
        if not name.endswith("k_proj.bias"):  # its gradient is rounding noise (test_trainer)
            torch.testing.assert_close(
                padded.module.state_dict()[name], weight, rtol=1e-4, atol=1e-5
            )


@pytest.mark.parametrize(
    "changes",
    [
        {"num_workers": 2, "merge_micro_batches": True},
        {"merge_micro_batches": False},  # 2 micro-batches an update
        {"merge_micro_batches": True, "compile": ("model",)},
        {"merge_micro_batches": True, "compile": ("loss",)},
    ],
)
def test_static_shapes_refuses_what_a_graph_cannot_hold_naming_the_key(changes):
    with pytest.raises(ConfigError, match="static_shapes"):
        TrainConfig(tokens_per_step=160, max_tokens_per_batch=80, static_shapes=True, **changes)


def test_eval_max_tokens_sets_the_validation_batches():
    assert TrainConfig(max_tokens_per_batch=80).eval_tokens == 80
    assert TrainConfig(max_tokens_per_batch=80, eval_max_tokens=4000).eval_tokens == 4000
    with pytest.raises(ConfigError, match="eval_max_tokens"):
        TrainConfig(eval_max_tokens=0)
