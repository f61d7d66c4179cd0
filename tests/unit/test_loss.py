"""Label-smoothed cross-entropy against an explicit smoothed target distribution."""

import pytest
import torch
import torch.nn.functional as F

import transformer_core.loss as loss_module
from transformer_core.loss import label_smoothed_nll, linear_label_smoothed_nll

PAD = 0


def _explicit(logits, target, eps, pad_id):
    """Cross-entropy against q = (1 - eps) * one_hot + eps / V, summed over non-pad positions."""
    vocab = logits.size(-1)
    logp = torch.log_softmax(logits.double().reshape(-1, vocab), dim=-1)
    target = target.reshape(-1)
    q = torch.full_like(logp, eps / vocab)
    q[torch.arange(target.numel()), target] += 1.0 - eps
    keep = target != pad_id
    loss = -(q * logp).sum(-1)[keep].sum()
    nll = -logp[torch.arange(target.numel()), target][keep].sum()
    return loss, nll, int(keep.sum())


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    target = torch.randint(1, 11, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_smoothed_one_hot_distribution(batch, eps):
    logits, target = batch
    loss, nll, n = label_smoothed_nll(logits, target, eps, PAD)
    ref_loss, ref_nll, ref_n = _explicit(logits, target, eps, PAD)
    assert int(n) == ref_n == 15 - 2 - 4
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)


def test_eps_zero_equals_cross_entropy(batch):
    logits, target = batch
    loss, nll, n = label_smoothed_nll(logits, target, 0.0, PAD)
    ce = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    torch.testing.assert_close(loss, ce)
    torch.testing.assert_close(nll, ce)


def test_padding_is_ignored(batch):
    logits, target = batch
    base = label_smoothed_nll(logits, target, 0.1, PAD)
    changed = logits.clone()
    changed[2, 1:] = torch.randn(4, 11) * 100  # logits at padded positions
    again = label_smoothed_nll(changed, target, 0.1, PAD)
    for a, b in zip(base, again, strict=True):
        torch.testing.assert_close(a, b)


def test_flat_input_equals_batched(batch):
    logits, target = batch
    a = label_smoothed_nll(logits, target, 0.1, PAD)
    b = label_smoothed_nll(logits.reshape(-1, 11), target.reshape(-1), 0.1, PAD)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)


def test_bf16_logits_computed_in_float32(batch):
    logits, target = batch
    bf = logits.bfloat16()
    loss, nll, _ = label_smoothed_nll(bf, target, 0.1, PAD)
    assert loss.dtype == nll.dtype == torch.float32
    ref_loss, _, _ = _explicit(bf.float(), target, 0.1, PAD)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)


def test_gradient_flows_only_through_real_tokens(batch):
    logits, target = batch
    logits = logits.clone().requires_grad_(True)
    loss, _, _ = label_smoothed_nll(logits, target, 0.1, PAD)
    loss.backward()
    assert torch.all(logits.grad[2, 1:] == 0)
    assert logits.grad[0, 0].abs().sum() > 0


def test_smoothing_penalises_overconfidence():
    # A confident correct prediction: NLL near 0, but the smoothed loss stays well above it.
    logits = torch.tensor([[20.0, 0.0, 0.0, 0.0]])
    target = torch.tensor([0])
    loss, nll, _ = label_smoothed_nll(logits, target, 0.1, pad_id=3)
    assert nll < 1e-6
    assert loss > 1.0


def test_bad_arguments(batch):
    logits, target = batch
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_nll(logits, target, 1.0, PAD)
    with pytest.raises(ValueError, match="disagree"):
        label_smoothed_nll(logits, target[:, :4], 0.1, PAD)


# -- the fused projection + loss ------------------------------------------------------------


def _fused_case(seed=0, n=37, d=8, vocab=13):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, d, generator=g, dtype=torch.float64)
    target = torch.randint(1, vocab, (n,), generator=g)
    target[::5] = PAD
    return hidden, weight, target


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_logits", [13, 5 * 13, 1 << 27])  # 1 row, 5 rows, one chunk
def test_fused_linear_loss_matches_logits_path(monkeypatch, eps, chunk_logits):
    """Loss, NLL, count and both gradients equal those of the whole-logits path, however the
    rows are chunked (37 rows: the last chunk is short)."""
    monkeypatch.setattr(loss_module, "CHUNK_LOGITS", chunk_logits)
    hidden, weight, target = _fused_case()
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = label_smoothed_nll(h1 @ w1.t(), target, eps, PAD)
    got = linear_label_smoothed_nll(h2, w2, target, eps, PAD)
    (ref[0] * 0.5).backward()
    (got[0] * 0.5).backward()
    assert int(got[2]) == int(ref[2]) == 37 - 8
    torch.testing.assert_close(got[0], ref[0].float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1].float(), rtol=1e-6, atol=1e-6)
    # Both paths take the softmax in float32: agreement to float32's precision.
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=2e-6)
    assert not got[1].requires_grad


def test_fused_linear_loss_keeps_batch_shape_and_ignores_pad_rows():
    hidden, weight, target = _fused_case(n=12)
    h = hidden.reshape(3, 4, -1).requires_grad_()
    loss, _, n = linear_label_smoothed_nll(h, weight, target.reshape(3, 4), 0.1, PAD)
    loss.backward()
    pad = target.reshape(3, 4) == PAD
    assert int(n) == int((~pad).sum())
    assert h.grad.shape == h.shape
    assert h.grad[pad].abs().max() == 0  # a pad row's state gets no gradient
    assert h.grad[~pad].abs().min() > 0


def test_fused_linear_loss_under_autocast_projects_in_low_precision():
    """Under bf16 autocast the projection runs in bf16 (as the plain path's Linear does) and the
    gradients come back in the inputs' float32; the loss agrees with the plain path's under the
    same autocast."""
    hidden, weight, target = (t.float() if t.is_floating_point() else t for t in _fused_case())
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h1, w1)
        assert logits.dtype == torch.bfloat16
        ref = label_smoothed_nll(logits, target, 0.1, PAD)
        got = linear_label_smoothed_nll(h2, w2, target, 0.1, PAD)
    ref[0].backward()
    got[0].backward()
    assert h2.grad.dtype == w2.grad.dtype == torch.float32
    torch.testing.assert_close(got[0], ref[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=2e-2, atol=2e-2)


def test_fused_linear_loss_rejects_mismatched_shapes():
    hidden, weight, target = _fused_case()
    with pytest.raises(ValueError, match="disagree"):
        linear_label_smoothed_nll(hidden, weight, target[:-1], 0.1, PAD)
