"""softdot.linear_cross_entropy against F.linear + F.cross_entropy in
float64, through autograd, on bfloat16 inputs, and its errors."""

import ml_dtypes
import numpy as np
import pytest

import softdot

torch = pytest.importorskip("torch")
F = torch.nn.functional


def case(n=37, d=48, v=300, seed=0, ignored=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) * (2.0 / d**0.5)
    t = torch.randint(0, v, (n,), generator=g)
    if ignored:
        t[3::5] = -100
    return h, w, t


def reference(h, w, t, **kw):
    """loss, dH, dW in float64 from the float32 inputs."""
    h64 = h.double().requires_grad_()
    w64 = w.double().requires_grad_()
    loss = F.cross_entropy(F.linear(h64, w64), t, **kw)
    loss.sum().backward()
    return loss.detach(), h64.grad, w64.grad


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum", "label_smoothing": 0.1},
        {"reduction": "none", "label_smoothing": 0.3, "ignore_index": 7},
    ],
)
def test_matches_float64_torch(kw):
    h, w, t = case()
    if kw.get("ignore_index") == 7:
        t[t == -100] = 7
    loss, gh, gw = softdot.linear_cross_entropy(h, w, t, grad=True, **kw)
    ref, rh, rw = reference(h, w, t, **kw)
    assert loss.dtype == torch.float32 and gh.dtype == torch.float32
    np.testing.assert_allclose(loss.double(), ref, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(gh.double(), rh, rtol=0, atol=2e-6 * rh.abs().max())
    np.testing.assert_allclose(gw.double(), rw, rtol=0, atol=2e-6 * rw.abs().max())
    # numpy in, numpy out: the same numbers.
    ln, ghn, gwn = softdot.linear_cross_entropy(h.numpy(), w.numpy(), t.numpy(), grad=True, **kw)
    np.testing.assert_array_equal(ln, loss.numpy())
    np.testing.assert_array_equal(ghn, gh.numpy())
    np.testing.assert_array_equal(gwn, gw.numpy())


def test_autograd_matches_float64_torch():
    h, w, t = case(seed=1)
    hh = h.clone().requires_grad_()
    ww = w.clone().requires_grad_()
    loss = softdot.linear_cross_entropy(hh, ww, t, label_smoothing=0.05)
    assert loss.grad_fn is not None
    (2.5 * loss).backward()
    ref, rh, rw = reference(h, w, t, label_smoothing=0.05)
    assert abs(loss.item() - ref.item()) <= 2e-6 * abs(ref.item())
    np.testing.assert_allclose(hh.grad.double(), 2.5 * rh, atol=5e-6 * rh.abs().max())
    np.testing.assert_allclose(ww.grad.double(), 2.5 * rw, atol=5e-6 * rw.abs().max())
    # "none" with a uniform incoming gradient (loss.sum()); a per-row one raises.
    hh.grad = None
    softdot.linear_cross_entropy(hh, ww, t, reduction="none").sum().backward()
    _, rh, _ = reference(h, w, t, reduction="sum")
    np.testing.assert_allclose(hh.grad.double(), rh, atol=5e-6 * rh.abs().max())
    per_row = softdot.linear_cross_entropy(hh, ww, t, reduction="none")
    with pytest.raises(NotImplementedError, match="same incoming gradient"):
        (per_row * torch.arange(37.0)).sum().backward()
    # Double backward raises.
    loss = softdot.linear_cross_entropy(hh, ww, t)
    (g,) = torch.autograd.grad(loss, hh, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_bfloat16_inputs():
    h, w, t = case(seed=2)
    hb, wb = h.bfloat16(), w.bfloat16()
    loss, gh, gw = softdot.linear_cross_entropy(hb, wb, t, grad=True)
    # The float32 path on the widened values, bit for bit.
    lf, ghf, gwf = softdot.linear_cross_entropy(hb.float(), wb.float(), t, grad=True)
    assert loss.item() == lf.item()
    assert torch.equal(gh, ghf) and torch.equal(gw, gwf)
    ref, rh, _ = reference(hb.float(), wb.float(), t)
    assert abs(loss.item() - ref.item()) <= 2e-6 * abs(ref.item())
    # ml_dtypes arrays.
    ln = softdot.linear_cross_entropy(
        h.numpy().astype(ml_dtypes.bfloat16), w.numpy().astype(ml_dtypes.bfloat16), t.numpy()
    )
    assert float(ln) == loss.item()
    # autograd: gradients in the inputs' dtype.
    hr = hb.clone().requires_grad_()
    softdot.linear_cross_entropy(hr, wb, t).backward()
    assert hr.grad.dtype == torch.bfloat16
    assert torch.equal(hr.grad, gh.bfloat16())


def test_all_ignored():
    h, w, t = case(n=6, ignored=False)
    t[:] = -100
    loss, gh, gw = softdot.linear_cross_entropy(h, w, t, grad=True)
    assert torch.isnan(loss)
    assert not gh.any() and not gw.any()
    assert softdot.linear_cross_entropy(h, w, t, reduction="sum").item() == 0.0


def test_errors():
    h, w, t = case(n=4, d=8, v=10, ignored=False)
    with pytest.raises(ValueError, match=r"targets\[2\] = 10"):
        bad = t.clone()
        bad[2] = 10
        softdot.linear_cross_entropy(h, w, bad)
    with pytest.raises(ValueError, match="weight"):
        softdot.linear_cross_entropy(h, w[:, :7], t)
    with pytest.raises(ValueError, match="targets"):
        softdot.linear_cross_entropy(h, w, t[:3])
    with pytest.raises(TypeError, match="float64"):
        softdot.linear_cross_entropy(h.double(), w.double(), t)
    with pytest.raises(TypeError, match="different dtypes"):
        softdot.linear_cross_entropy(h, w.bfloat16(), t)
    with pytest.raises(ValueError, match="label_smoothing"):
        softdot.linear_cross_entropy(h, w, t, label_smoothing=2.0)
    with pytest.raises(ValueError, match="reduction"):
        softdot.linear_cross_entropy(h, w, t, reduction="avg")
