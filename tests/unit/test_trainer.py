"""The Trainer without Ray: exact resume from its state dict, the paper's schedule, learning."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from helpers.trainer import SEED, VOCAB, as_checkpoint, make_trainer, reversal, settings

from training import numerics
from training.distributed import seed_all
from training.numerics import native_cpu_bf16
from training.trainer import Trainer
from transformer_core import Transformer, presets
from transformer_core.schedule import learning_rate


@pytest.fixture(autouse=True)
def one_thread():
    # Two shared cores: oversubscribed intra-op threads slow these CPU-bound tests down.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(trainer: Trainer, steps: int) -> list[dict[str, float]]:
    return [trainer.train_step() for _ in range(steps)]


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


def test_fit_splits_its_wall_time_by_part_of_the_loop():
    config = settings(steps=4, stop_after=4, log_every=2, eval_every=4, checkpoint_every=2)
    trainer = make_trainer(config)
    slow_save = 0.05
    trainer.fit(lambda metrics: time.sleep(slow_save))  # two checkpoints at steps 2 and 4
    split = trainer.loop_split
    assert set(split) == {"step", "log", "validation", "checkpoint"}
    assert split["checkpoint"] >= 2 * slow_save and split["step"] > 0 and split["validation"] > 0
    assert trainer.step == 4


def test_loss_falls_on_a_learnable_task():
    config = settings(steps=100)
    trainer = make_trainer(config)
    losses = [m["loss"] for m in run(trainer, 100)]
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < first - 0.4, (first, last)
    untrained = make_trainer(config).evaluate()["val_loss"]
    assert trainer.evaluate()["val_loss"] < untrained - 0.3


def test_prefetched_batches_train_exactly_as_batches_collated_in_the_step():
    config = settings(steps=12)  # 12 steps of 2 batches cross several epochs of 96 rows
    inline = run(make_trainer(settings(steps=12, prefetch=0)), 12)
    ahead = make_trainer(config)
    assert config.prefetch > 0
    trace = run(ahead, 12)
    ahead.close()
    keys = ("loss", "nll", "grad_norm", "epoch", "batch_index")
    assert [{k: m[k] for k in keys} for m in trace] == [{k: m[k] for k in keys} for m in inline]
    assert trace[-1]["epoch"] >= 1


def test_merged_micro_batches_train_as_the_accumulated_ones():
    # No dropout: its draws differ by batch shape; the rest is the same sum in another order.
    def trainer(merge: bool) -> Trainer:
        torch.manual_seed(SEED)
        module = Transformer(presets.debug().replace(max_len=32, dropout=0.0), VOCAB)
        config = settings(merge_micro_batches=merge, prefetch=0)
        return Trainer(module, config, reversal(96, 1), reversal(16, 2), seed=SEED)

    split, merged = trainer(False), trainer(True)
    assert [len(h) for h in (split.prefetcher.next()[1], merged.prefetcher.next()[1])] == [2, 1]
    split, merged = trainer(False), trainer(True)
    a, b = run(split, 8), run(merged, 8)
    for key in ("loss", "nll", "grad_norm"):
        assert [m[key] for m in b] == pytest.approx([m[key] for m in a], rel=1e-5), key
    position = [(m["epoch"], m["batch_index"]) for m in a]
    assert [(m["epoch"], m["batch_index"]) for m in b] == position
    for name, weight in split.module.state_dict().items():
        # A key bias shifts every score of a query alike, so softmax cancels it: its gradient is
        # zero but for rounding (~1e-9), and Adam's normalisation makes that noise a full step.
        if not name.endswith("k_proj.bias"):
            got = merged.module.state_dict()[name]
            torch.testing.assert_close(got, weight, rtol=1e-4, atol=1e-5)


def test_a_collate_error_in_the_prefetch_thread_is_raised_by_the_step():
    trainer = make_trainer(settings())
    tgt_offsets = trainer.train_data.chunks[0][3]
    tgt_offsets[5:] += 1_000_000  # rows past 4 now read past the values
    with pytest.raises((IndexError, ValueError)):
        run(trainer, 8)
    trainer.close()


def test_padded_batches_are_multiples_of_pad_multiple_within_the_token_budget():
    from training.data import BatchStream

    trainer = make_trainer(settings(pad_multiple=8, max_tokens_per_batch=96))
    run(trainer, 1)
    stream = BatchStream(trainer.train_data, 96, SEED, pad_multiple=8)
    for rows in stream.take(len(trainer.train_data)):  # more than an epoch's batches
        src, tgt_in, tgt_out = trainer._collate(rows)
        assert src.shape[1] % 8 == 0 and tgt_in.shape[1] % 8 == 0
        assert src.numel() <= 96 and tgt_out.numel() <= 96
        assert tgt_in.shape == tgt_out.shape


def test_pad_multiple_past_max_len_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="train.pad_multiple"):
        make_trainer(settings(pad_multiple=40))  # max_len 32: rows of up to 9 pad to 40


def test_throughput_metrics_count_model_flops():
    metrics = run(make_trainer(settings(steps=2)), 2)[-1]
    assert metrics["tflops_per_worker"] > 0
    assert metrics["target_tokens_per_s"] > 0
    assert metrics["mfu"] is None  # no datasheet peak for a CPU


def test_fused_adam_takes_the_same_steps_as_multi_tensor_adam():
    plain = make_trainer(settings(fused_adam=False, steps=3))
    run(plain, 3)  # dropout draws from the global RNG: one trainer at a time
    fused = make_trainer(settings(fused_adam=True, steps=3))
    run(fused, 3)
    assert fused.optimizer.defaults["fused"] and not plain.optimizer.defaults["fused"]
    expected = plain.module.state_dict()
    for name, value in fused.module.state_dict().items():
        if name.endswith("k_proj.bias"):
            # Softmax ignores a shift shared by all keys: this gradient is rounding noise, which
            # Adam's m / sqrt(v) turns into full-size steps of either sign.
            continue
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)


def gradients_at_each_step(
    trainer: Trainer, steps: int
) -> tuple[list[dict], list[dict[str, torch.Tensor]]]:
    """``steps`` train steps: their logged metrics, and the gradients each optimizer step took."""
    taken: list[dict[str, torch.Tensor]] = []
    names = {p: n for n, p in trainer.module.named_parameters()}
    hook = trainer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: taken.append(
            {names[p]: p.grad.clone() for group in optimizer.param_groups for p in group["params"]}
        )
    )
    try:
        return run(trainer, steps), taken
    finally:
        hook.remove()


def test_fused_loss_takes_the_same_steps_as_the_logits_path():
    """The projection fused with the loss (chunks of 2 rows here) trains like the whole-logits
    path: same logged losses and, at each of 3 steps, the same gradients to float32 rounding.
    Gradients, not weights after the steps: Adam's m / sqrt(v) turns rounding noise in a
    near-zero gradient into a full-size step of either sign (seen on one of 16,384 feed-forward
    weights on an AVX-512 CPU), which says nothing about the loss."""

    plain = make_trainer(settings(fused_loss=False, steps=3))
    plain_metrics, plain_grads = gradients_at_each_step(plain, 3)
    saved = numerics.CPU_CHUNK_LOGITS
    numerics.CPU_CHUNK_LOGITS = 2 * VOCAB  # a CPU trainer's chunks
    try:
        fused = make_trainer(settings(fused_loss=True, steps=3))
        fused_metrics, fused_grads = gradients_at_each_step(fused, 3)
    finally:
        numerics.CPU_CHUNK_LOGITS = saved
    assert fused.fused_loss and not plain.fused_loss
    for a, b in zip(fused_metrics, plain_metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert len(fused_grads) == len(plain_grads) == 3
    for step, (got, expected) in enumerate(zip(fused_grads, plain_grads, strict=True), 1):
        assert got.keys() == expected.keys()
        scale = max(g.abs().max().item() for g in expected.values())
        for name, grad in got.items():
            torch.testing.assert_close(
                grad, expected[name], rtol=1e-4, atol=1e-5 * scale, msg=f"step {step}: {name}"
            )


@pytest.mark.skipif(not native_cpu_bf16(), reason="this CPU has no native bf16")
def test_cpu_bf16_trains_like_float32_with_bf16_matmuls():
    """``precision: bf16`` on a CPU: the forward's linear layers and the fused loss's projection
    in bf16, the rest float32: the first steps' losses and gradients within bf16's rounding of
    float32's."""
    fp32 = make_trainer(settings(fused_loss=True, steps=3))
    fp32_metrics, fp32_grads = gradients_at_each_step(fp32, 3)
    bf16 = make_trainer(settings(fused_loss=True, precision="bf16", steps=3))
    seen: set[torch.dtype] = set()
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.add(out.dtype) if isinstance(out, torch.Tensor) else None
    )
    try:
        bf16_metrics, bf16_grads = gradients_at_each_step(bf16, 3)
    finally:
        hook.remove()
    assert bf16.dtype == torch.bfloat16 and fp32.dtype is None
    assert torch.bfloat16 in seen  # autocast reached the layers
    for a, b in zip(bf16_metrics, fp32_metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=0.02)
        assert a["loss"] != b["loss"]  # not float32 after all
    for got, expected in zip(bf16_grads, fp32_grads, strict=True):
        assert all(g.dtype == torch.float32 for g in got.values())  # weights, grads: float32
        # The whole gradient (a key bias's is zero up to rounding: compared alone it is noise)
        flat = torch.cat([got[name].flatten() for name in expected])
        reference = torch.cat([g.flatten() for g in expected.values()])
        assert torch.nn.functional.cosine_similarity(flat, reference, 0) > 0.99


def test_cpu_bf16_without_native_bf16_warns_and_trains_in_float32(monkeypatch, caplog):
    monkeypatch.setattr(numerics, "native_cpu_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="training.numerics"):
        trainer = make_trainer(settings(precision="bf16"))
    assert trainer.dtype is None
    assert "train.precision: bf16" in caplog.text and "float32" in caplog.text
    metrics = run(trainer, 1)
    assert metrics[0]["loss"] == pytest.approx(
        run(make_trainer(settings()), 1)[0]["loss"], rel=1e-6
    )


@pytest.mark.slow  # torch.compile on CPU: ~1.5 minutes of compiling per case
@pytest.mark.parametrize("fused_loss", [False, True])
def test_compiled_training_takes_the_same_steps_as_eager_on_cpu(fused_loss):
    def trainer(**changes) -> Trainer:
        torch.manual_seed(SEED)  # no dropout: compiled code draws its masks differently
        module = Transformer(presets.debug().replace(max_len=32, dropout=0.0), VOCAB)
        # 48-token batches: filled to the budget, 8 steps of them still take 8 different shapes.
        config = settings(
            steps=8,
            pad_multiple=2,
            fused_loss=fused_loss,
            max_tokens_per_batch=48,
            tokens_per_step=96,
            **changes,
        )
        return Trainer(module, config, reversal(96, 1), reversal(16, 2), seed=SEED)

    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # this process's earlier graphs (the other case) do not count
    counters.clear()
    eager = run(trainer(), 8)
    compiled_trainer = trainer(compile=("model",))
    compiled = run(compiled_trainer, 8)
    for a, b in zip(compiled, eager, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)

    from training.data import BatchStream

    batches = BatchStream(reversal(96, 1), 48, SEED, pad_multiple=2).take(16)  # 8 steps' batches
    shapes = {compiled_trainer._collate(rows)[0].shape for rows in batches}
    # Dynamic shapes: the graphs do not grow with the shapes. Model and loss (or the fused loss's
    # chunk function) each compile for the first batch, again when two sizes that were equal
    # differ (dynamo's duck sizing) and once for a batch of one row (sizes 0 and 1 are always
    # specialised).
    assert counters["stats"]["unique_graphs"] <= 6 < len(shapes)


@pytest.mark.slow  # inductor compiles the chunk's loss: ~20 s on 2 cores
def test_compiling_the_loss_compiles_only_it_and_trains_as_the_eager_fused_loss():
    """``compile: [loss]`` with ``fused_loss``: the fused loss's chunks compiled (one graph
    family, not the model's), the same losses as the eager fused loss (the gradient is the same
    formula, fused)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = run(make_trainer(settings(fused_loss=True, steps=4)), 4)
    assert counters["stats"]["unique_graphs"] == 0
    compiled = run(make_trainer(settings(fused_loss=True, compile=("loss",), steps=4)), 4)
    assert 1 <= counters["stats"]["unique_graphs"] <= 3  # the chunk function's, no model's
    for a, b in zip(compiled, eager, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


def test_val_bleu_keeps_the_best_validation_and_patience_stops_the_run():
    from training.dev_bleu import DevBleu

    def detokenize(ids: list[int]) -> str:
        return " ".join(f"s{i}" for i in ids)

    def spoil_after_step_8(trainer: Trainer) -> None:
        # From step 9 every output token is UNK (no reference has one): dev BLEU drops to 0.
        if trainer.step > 8:
            with torch.no_grad():
                trainer.module.src_embed.weight.zero_()

    dev = reversal(16, 2)
    trainer = make_trainer(
        settings(steps=40, lr_scale=0.5, patience=2, bleu_sentences=16),
        callbacks=[spoil_after_step_8],
        dev_bleu=DevBleu(dev, detokenize, 16),
    )
    bleus = {}
    while not trainer.done:
        trainer.train_step()
        validation = trainer.maybe_evaluate()
        if validation:
            bleus[trainer.step] = validation["val_bleu"]
            assert trainer.best.improved == (trainer.best.record["step"] == trainer.step)
    assert max(bleus[4], bleus[8]) > 0, bleus  # it matched something before being spoiled
    best_step = max((4, 8), key=lambda s: (bleus[s], -s))  # the first of equals
    assert trainer.best.record == {"step": best_step, "val_bleu": bleus[best_step]}
    # Patience 2: two validations without a better BLEU, then a stop (not at step 40).
    assert trainer.step == best_step + 2 * 4 and trainer.best.since_best == 2
    assert all(bleus[s] == 0.0 for s in bleus if s > 8), bleus
    # The state carries it: a resumed run is still done.
    resumed = make_trainer(settings(steps=40, patience=2, bleu_sentences=16))
    resumed.load_state_dict(as_checkpoint(trainer.state_dict()))
    assert resumed.done and resumed.best.record == trainer.best.record


def test_val_bleu_of_moses_tokenized_text_gives_no_detokenize_warning(caplog):
    from training.dev_bleu import DevBleu

    # With tokenizer.moses the dev text is tokenized on purpose: each line ends in " .".
    bleu = DevBleu(reversal(120, 2), lambda ids: " ".join(f"s{i}" for i in ids) + " .", 120)
    with caplog.at_level("WARNING", logger="sacrebleu"):
        score = bleu.score(make_trainer(settings()).module, torch.device("cpu"))
    assert 0.0 <= score <= 100.0 and "detokenize" not in caplog.text


def test_logged_loss_is_the_token_weighted_mean_since_the_last_log():
    from training.data import BatchStream

    every_step = make_trainer(settings(log_every=1))
    losses = [m["loss"] for m in run(every_step, 8)]
    every_fourth = make_trainer(settings(log_every=4))
    logged = {}
    for _ in range(8):
        metrics = every_fourth.train_step()
        if metrics:
            logged[every_fourth.step] = metrics["loss"]
    assert sorted(logged) == [4, 8]
    # Target tokens of each step, from the same seeded plan the Trainer reads.
    data = reversal(96, 1)
    stream = BatchStream(data, settings().max_tokens_per_batch, SEED)
    tokens = [
        int(data.tgt_lens[np.concatenate(stream.take(every_step.accumulation))].sum())
        for _ in range(8)
    ]
    for end in (4, 8):
        steps = range(end - 4, end)
        expected = sum(losses[i] * tokens[i] for i in steps) / sum(tokens[i] for i in steps)
        assert logged[end] == pytest.approx(expected, rel=1e-5)
        assert not any(logged[end] == pytest.approx(losses[i], rel=1e-5) for i in steps)
