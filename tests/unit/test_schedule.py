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


def test_linear_decay_keeps_the_warmup_and_peak_then_reaches_zero_at_the_end():
    paper = [learning_rate(s, 128, 300, 0.6) for s in range(1, 301)]
    linear = [learning_rate(s, 128, 300, 0.6, "linear", 2000) for s in range(1, 2001)]
    assert linear[:300] == pytest.approx(paper, rel=1e-12), "the same warmup to the same peak"
    after = linear[299:]
    assert all(a > b for a, b in zip(after, after[1:], strict=False)), "then falls every step"
    # evenly, to 1/1701 of the peak at the last update: no update is wasted at zero
    steps = [b - a for a, b in zip(after, after[1:], strict=False)]
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)
    assert linear[-1] == pytest.approx(paper[-1] / 1701, rel=1e-9)
    assert learning_rate(2001, 128, 300, 0.6, "linear", 2000) == 0.0


def test_linear_decay_needs_its_end_and_an_unknown_decay_is_refused():
    with pytest.raises(ValueError, match="total_steps"):
        lr_lambda(128, 300, decay="linear")
    with pytest.raises(ValueError, match="total_steps >= warmup_steps, got 200"):
        lr_lambda(128, 300, decay="linear", total_steps=200)
    with pytest.raises(ValueError, match="'cosine' is not one of inverse_sqrt, linear"):
        learning_rate(5, 128, 300, decay="cosine")  # type: ignore[arg-type]


def test_a_scheduler_with_linear_decay_steps_the_optimizer_down_to_zero():
    opt = make_optimizer(torch.nn.Linear(2, 2))
    sched = make_scheduler(opt, 64, warmup_steps=2, decay="linear", total_steps=4)
    rates = []
    for _ in range(5):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    peak = learning_rate(2, 64, 2)
    assert rates == pytest.approx([peak / 2, peak, peak * 2 / 3, peak / 3, 0.0], rel=1e-9)


def test_the_total_names_the_run_to_resume_only_where_it_sets_the_rates():
    from tasks.framework.config import config_from_dict
    from tasks.train import resume_key

    def key(decay, steps):
        config = config_from_dict(
            {"name": "r", "train": {"decay": decay, "steps": steps, "warmup_steps": 10}}
        )
        return resume_key(config, {"shard": "s", "tokenizer": "t"})

    # the paper's schedule: more steps continue the same run; linear: 300 steps is another run
    assert key("inverse_sqrt", 200) == key("inverse_sqrt", 300)
    assert key("linear", 200) != key("linear", 300)
    assert key("linear", 200) != key("inverse_sqrt", 200)
