"""The paper's learning-rate schedule and optimiser settings (section 5.3)."""

import math

import pytest
import torch

from transformer_core.schedule import learning_rate, lr_lambda, make_optimizer, make_scheduler


def _paper(step, d_model, warmup):
    return 1 / math.sqrt(d_model) * min(1 / math.sqrt(step), step / warmup / math.sqrt(warmup))


@pytest.mark.parametrize("step", [1, 4000, 100_000])
def test_values_match_formula(step):
    assert learning_rate(step, 512, 4000) == pytest.approx(_paper(step, 512, 4000), rel=1e-12)


def test_known_peak_value():
    # At the peak both branches agree: 512^-0.5 * 4000^-0.5.
    assert learning_rate(4000, 512, 4000) == pytest.approx(1 / math.sqrt(512 * 4000))


def test_peak_at_warmup():
    steps = range(1, 20_001)
    rates = [learning_rate(s, 512, 4000) for s in steps]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000
    warmup, decay = rates[:4000], rates[3999:]
    assert all(a < b for a, b in zip(warmup, warmup[1:], strict=False)), "linear warmup rises"
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False)), "then decays"


def test_scale_multiplies():
    assert learning_rate(123, 1024, 4000, scale=2.0) == pytest.approx(
        2 * learning_rate(123, 1024, 4000)
    )


def test_step_zero_is_an_error():
    with pytest.raises(ValueError, match="step 0"):
        learning_rate(0, 512)


def test_optimizer_settings():
    model = torch.nn.Linear(3, 4)
    opt = make_optimizer(model)
    assert isinstance(opt, torch.optim.Adam)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert sum(p.numel() for p in group["params"]) == 16


def test_shared_parameters_once():
    emb = torch.nn.Embedding(10, 4)
    model = torch.nn.Module()
    model.emb = emb
    model.proj = torch.nn.Linear(4, 10, bias=False)
    model.proj.weight = emb.weight
    opt = make_optimizer(model)
    assert len(opt.param_groups[0]["params"]) == 1


def test_scheduler_first_update_uses_step_one():
    model = torch.nn.Linear(2, 2)
    opt = make_optimizer(model)
    sched = make_scheduler(opt, d_model=512, warmup_steps=10)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([_paper(s, 512, 10) for s in (1, 2, 3)])
    assert lr_lambda(512, 10)(0) == pytest.approx(_paper(1, 512, 10))
