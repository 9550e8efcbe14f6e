"""softdot.cross_entropy against torch.nn.functional.cross_entropy (the loss
for every reduction, ignore_index and label smoothing, and the gradient
against torch's autograd in float64), numpy and torch in and out, the
special values softdot defines, and the errors; on tensors that require grad,
the autograd Function (softdot.torch.CrossEntropy): gradcheck and
gradgradcheck in float64, gradients and higher derivatives against torch's,
and the gradients at special values."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softdot


def torch_reference(x, t, **kw):
    """torch's loss and autograd gradient in float64 (the reference)."""
    xd = x.detach().double().clone().requires_grad_(True)
    loss = F.cross_entropy(xd, t, **kw)
    (loss.sum() if loss.ndim else loss).backward()
    return loss.detach(), xd.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
def test_against_torch(rng, dtype, reduction, eps):
    n, c = 9, 37
    x = torch.from_numpy(rng.standard_normal((n, c)) * 4).to(dtype)
    t = torch.from_numpy(rng.integers(0, c, n)).long()
    t[3] = -100
    t[5] = 7
    before = x.clone()
    loss, grad = softdot.cross_entropy(x, t, label_smoothing=eps, reduction=reduction, grad=True)
    assert torch.equal(x, before)
    assert isinstance(loss, torch.Tensor) and loss.dtype == dtype
    assert isinstance(grad, torch.Tensor) and grad.dtype == dtype and grad.shape == x.shape
    ref_loss, ref_grad = torch_reference(x, t, label_smoothing=eps, reduction=reduction)
    tol = 2e-7 if dtype == torch.float32 else 1e-15
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=tol, atol=tol)
    # torch in the same dtype agrees to its own rounding.
    torch.testing.assert_close(
        loss,
        F.cross_entropy(x, t, label_smoothing=eps, reduction=reduction),
        rtol=1e-5 if dtype == torch.float32 else 1e-12,
        atol=1e-6 if dtype == torch.float32 else 1e-13,
    )
    assert torch.all(grad[3] == 0)


def test_numpy_and_ignore_index(rng):
    x = rng.standard_normal((6, 5))
    t = np.array([0, 4, 2, 2, 1, 3], dtype=np.int32)
    loss = softdot.cross_entropy(x, t, ignore_index=2, reduction="none")
    assert isinstance(loss, np.ndarray) and loss.dtype == np.float64 and loss.shape == (6,)
    ref, _ = torch_reference(
        torch.from_numpy(x), torch.from_numpy(t).long(), ignore_index=2, reduction="none"
    )
    np.testing.assert_allclose(loss, ref.numpy(), rtol=1e-15, atol=1e-16)
    assert loss[2] == 0 and loss[3] == 0
    m = softdot.cross_entropy(x, t, ignore_index=2)
    assert isinstance(m, np.float64)
    np.testing.assert_allclose(m, ref.numpy().sum() / 4, rtol=1e-15)
    # One row: 1-d logits and a 0-d target.
    one, g = softdot.cross_entropy(x[1], np.int64(4), grad=True)
    np.testing.assert_allclose(one, loss[1], rtol=1e-15)
    assert g.shape == (5,)
    # Strided rows (every other row), no copy needed.
    xs = rng.standard_normal((8, 5)).astype(np.float32)[::2]
    ls = softdot.cross_entropy(xs, np.array([1, 2, 3, 4]), reduction="none")
    ref_s, _ = torch_reference(
        torch.from_numpy(np.ascontiguousarray(xs)), torch.tensor([1, 2, 3, 4]), reduction="none"
    )
    np.testing.assert_allclose(ls, ref_s.numpy(), rtol=2e-7)


def test_all_ignored_mean_is_nan():
    x = np.zeros((2, 3), dtype=np.float32)
    loss, g = softdot.cross_entropy(x, np.array([-100, -100]), grad=True)
    assert np.isnan(loss)
    assert np.all(g == 0)


def test_special_values():
    inf = np.inf
    x = np.array([[0.0, -inf, 1.0], [-inf, -inf, -inf], [0.0, np.nan, 1.0]])
    loss, g = softdot.cross_entropy(x, np.array([1, 0, 2]), reduction="none", grad=True)
    assert loss[0] == inf and loss[1] == inf and np.isnan(loss[2])
    np.testing.assert_array_equal(g[1], [-1.0, 0.0, 0.0])  # torch gives NaN here
    assert np.all(np.isnan(g[2]))
    assert np.all(np.isfinite(g[0]))


def test_errors():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"targets\[1\] = 3"):
        softdot.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="label_smoothing"):
        softdot.cross_entropy(x, np.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        softdot.cross_entropy(x, np.array([0, 1]), reduction="avg")
    with pytest.raises(TypeError, match="targets"):
        softdot.cross_entropy(x, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="targets"):
        softdot.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="torch"):
        softdot.cross_entropy(torch.zeros(2, 3), np.array([0, 1]))
    # Through the autograd Function, the same checks and messages.
    xg = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match=r"targets\[1\] = 3"):
        softdot.cross_entropy(xg, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="label_smoothing"):
        softdot.cross_entropy(xg, torch.tensor([0, 1]), label_smoothing=-0.5)
    with pytest.raises(ValueError, match="reduction"):
        softdot.cross_entropy(xg, torch.tensor([0, 1]), reduction="avg")
    with pytest.raises(TypeError, match="torch"):
        softdot.cross_entropy(xg, np.array([0, 1]))


def test_strided_and_column_major_layouts(rng):
    """Column-strided and column-major tensors give torch's values."""
    x = torch.from_numpy(rng.standard_normal((4, 10)))
    t = torch.tensor([0, 9, 3, 4])
    for v in (x[:, ::2], x.T.contiguous().T):
        tt = t.clamp(max=v.shape[1] - 1)
        torch.testing.assert_close(
            softdot.cross_entropy(v, tt), F.cross_entropy(v, tt), rtol=1e-15, atol=1e-15
        )


# ---- autograd -----------------------------------------------------------------------------

REDUCTIONS = ["mean", "sum", "none"]


def _logits_and_targets(rng, dtype, n=6, c=7):
    x = torch.from_numpy(rng.standard_normal((n, c)) * 2).to(dtype)
    t = torch.from_numpy(rng.integers(0, c, n)).long()
    t[2] = -100  # an ignored row
    return x, t


def _backward_cls():
    import softdot.torch as st

    return st.CrossEntropy._backward_cls


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_autograd_function_is_used(rng, reduction):
    x, t = _logits_and_targets(rng, torch.float64)
    x.requires_grad_()
    loss = softdot.cross_entropy(x, t, reduction=reduction)
    assert loss.requires_grad and type(loss.grad_fn) is _backward_cls()
    assert type(loss.grad_fn).__name__ == "CrossEntropyBackward"
    # grad=True: the loss keeps its grad_fn, the gradient comes detached.
    loss2, g = softdot.cross_entropy(x, t, reduction=reduction, grad=True)
    assert type(loss2.grad_fn) is _backward_cls() and not g.requires_grad
    (loss2.sum() if loss2.ndim else loss2).backward()
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)
    # No autograd: under no_grad, or on a detached tensor.
    with torch.no_grad():
        assert softdot.cross_entropy(x, t, reduction=reduction).grad_fn is None
    assert softdot.cross_entropy(x.detach(), t).grad_fn is None
    # softdot.torch.cross_entropy always builds the graph.
    import softdot.torch as st

    assert type(st.cross_entropy(x, t).grad_fn) is _backward_cls()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("eps", [0.0, 0.15, 1.0])
def test_gradcheck_and_gradgradcheck(rng, reduction, eps):
    """Every reduction, label smoothing, an ignored row, a custom
    ignore_index, and one row (1-d logits, a 0-d target)."""
    x, t = _logits_and_targets(rng, torch.float64)
    x.requires_grad_()

    def loss(z, tt=t, ii=-100):
        return softdot.cross_entropy(
            z, tt, ignore_index=ii, reduction=reduction, label_smoothing=eps
        )

    assert torch.autograd.gradcheck(loss, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradgradcheck(loss, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    t5 = t.clone()
    t5[2] = t5[4] = 5  # ignore_index 5: two ignored rows

    def loss5(z):
        return loss(z, t5, 5)

    assert torch.autograd.gradcheck(loss5, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradgradcheck(loss5, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    row = x[0].detach().clone().requires_grad_()

    def loss_row(z):
        return loss(z, t[0])

    assert torch.autograd.gradcheck(loss_row, (row,), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradgradcheck(loss_row, (row,), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradients_match_torch_float32(rng, reduction, eps):
    """loss.backward() through softdot against torch's F.cross_entropy in
    float32: within torch's own rounding (a few eps of the largest weight
    term), and within 2^-22 of torch's float64 gradient (softdot's bound is
    c ulp(p) + 1 ulp, about 2^-23 for these magnitudes)."""
    x0, t = _logits_and_targets(rng, torch.float32, n=9, c=37)
    x0 = x0 * 2
    w = torch.from_numpy(rng.uniform(0.5, 2.0, 9)).float()
    kw = dict(reduction=reduction, label_smoothing=eps)

    def reduce(loss):
        return (loss * w).sum() if loss.ndim else loss * 3.0

    x = x0.clone().requires_grad_()
    reduce(softdot.cross_entropy(x, t, **kw)).backward()
    xt = x0.clone().requires_grad_()
    reduce(F.cross_entropy(xt, t, **kw)).backward()
    f32 = torch.finfo(torch.float32).eps
    scale = 6.0 if reduction != "none" else float(w.max())
    torch.testing.assert_close(x.grad, xt.grad, rtol=8 * f32, atol=8 * f32 * scale)
    xd = x0.double().requires_grad_()
    reduce_d = (lambda v: (v * w.double()).sum()) if reduction == "none" else (lambda v: v * 3.0)
    reduce_d(F.cross_entropy(xd, t, **kw)).backward()
    err = (x.grad.double() - xd.grad).abs()
    assert float(err.max()) <= 2.0**-22 * scale, float(err.max())
    assert torch.all(x.grad[2] == 0)  # the ignored row


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_second_and_third_derivatives_match_torch(rng, reduction):
    """A gradient penalty (create_graph) and one third derivative against
    torch in float64, with -inf logits in the rows (masked classes)."""
    x0, t = _logits_and_targets(rng, torch.float64)
    x0[1, 3] = -float("inf")
    x0[4, ::2] = -float("inf")
    t[4] = 1
    kw = dict(reduction=reduction, label_smoothing=0.1)
    res = []
    for f in (softdot.cross_entropy, F.cross_entropy):
        x = x0.clone().requires_grad_()
        out = f(x, t, **kw)
        (g1,) = torch.autograd.grad(out.sum() if out.ndim else out, x, create_graph=True)
        (g2,) = torch.autograd.grad((g1 * g1).sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad(g2[:, 1].sum(), x)
        res.append((g1, g2, g3))
    for a, b in zip(*res):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_torch_func_grad(rng):
    import softdot.torch as st

    x, t = _logits_and_targets(rng, torch.float64)
    g = torch.func.grad(lambda z: st.cross_entropy(z, t, label_smoothing=0.2))(x)
    gt = torch.func.grad(lambda z: F.cross_entropy(z, t, label_smoothing=0.2))(x)
    torch.testing.assert_close(g, gt, rtol=1e-13, atol=1e-15)


INF = float("inf")
NAN = float("nan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_gradient_special_values(dtype, reduction, eps):
    """Through autograd: -inf logits get exactly c (0 - eps / V) (0 without
    smoothing), a row of only -inf -c ((1 - eps) one_hot + eps / V) where torch
    gives NaN, +inf logits the limit (torch's gradient at large finite logits),
    a NaN row NaN in that row only (an ignored NaN row zeros), never a NaN in
    another row."""
    x0 = torch.tensor(
        [
            [0.5, -INF, 2.0, -INF, 1.0],
            [-INF, -INF, -INF, -INF, -INF],
            [INF, 0.0, INF, 1.0, -INF],
            [1.0, NAN, 0.0, 2.0, 3.0],
            [NAN, 1.0, 0.0, 2.0, 3.0],
            [0.25, -1.0, 2.0, 0.0, 1.5],
        ],
        dtype=dtype,
    )
    t = torch.tensor([2, 3, 0, 1, -100, 4])
    v = x0.shape[1]
    x = x0.clone().requires_grad_()
    loss = softdot.cross_entropy(x, t, reduction=reduction, label_smoothing=eps)
    (loss.sum() if loss.ndim else loss).backward()
    g = x.grad.double()
    c = 1 / 5 if reduction == "mean" else 1.0
    tiny = 4 * torch.finfo(dtype).eps
    # Row 0: -inf logits, not the target.
    for j in (1, 3):
        if eps == 0:
            assert g[0, j] == 0
        else:
            assert abs(g[0, j] + c * eps / v) <= tiny * c
    # Row 1: every logit -inf (the target has probability 0).
    want = torch.full((v,), -c * eps / v, dtype=torch.float64)
    want[3] -= c * (1 - eps)
    torch.testing.assert_close(g[1], want, rtol=0, atol=tiny)
    # Row 2: two +inf logits: torch's gradient with them at 1e4 (where the
    # other weights are exactly 0 in float64).
    xl = torch.where(torch.isinf(x0[2:3]) & (x0[2:3] > 0), 1e4, x0[2:3]).double()
    xl.requires_grad_()
    lt = F.cross_entropy(xl, t[2:3], reduction="sum", label_smoothing=eps)
    lt.backward()
    torch.testing.assert_close(g[2], c * xl.grad[0], rtol=0, atol=tiny)
    # Rows 3 (NaN) and 4 (NaN, ignored).
    assert torch.isnan(g[3]).all()
    assert (g[4] == 0).all()
    # Every other row finite.
    assert torch.isfinite(g[[0, 1, 2, 5]]).all()


def test_infinite_incoming_gradient_times_zero_is_zero():
    """reduction='none' with an infinite gradient for a row: entries whose
    gradient is 0 (ignored rows, -inf logits without smoothing) stay 0, not
    0 * inf = NaN; the others become +-inf."""
    x = torch.tensor(
        [[0.0, -INF, 1.0], [2.0, 0.0, 1.0], [1.0, 2.0, 3.0]], dtype=torch.float64
    ).requires_grad_()
    t = torch.tensor([0, -100, 2])
    loss = softdot.cross_entropy(x, t, reduction="none")
    loss.backward(torch.tensor([INF, INF, 1.0], dtype=torch.float64))
    g = x.grad
    assert g[0, 1] == 0 and g[0, 0] == -INF and g[0, 2] == INF
    assert (g[1] == 0).all()
    assert torch.isfinite(g[2]).all()
    # NaN incoming: NaN in that row, never hidden.
    x.grad = None
    softdot.cross_entropy(x, t, reduction="none").backward(
        torch.tensor([1.0, 1.0, NAN], dtype=torch.float64)
    )
    assert torch.isnan(x.grad[2]).all() and torch.isfinite(x.grad[:2]).all()
