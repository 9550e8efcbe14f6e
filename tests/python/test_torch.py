"""CPU torch tensors: torch in gives torch out for every function; softmax,
log_softmax and logsumexp against torch 2.13 (torch.softmax,
torch.log_softmax, torch.logsumexp) and the exact reference; softdot.torch's
autograd Functions (gradients against torch's, torch.autograd.gradcheck in
float64 with temperature and dim=0; second and third derivatives against
torch's, gradgradcheck and torch.func.grad); the softmax family dispatching
to them for tensors that require grad."""

import functools

import numpy as np
import pytest
import torch

import softdot
import softdot.torch as st

from conftest import assert_log_softmax_bound, assert_ulp, logsumexp_ref, softmax_ref

TFLOATS = (torch.float32, torch.float64)


def randn(rng, shape, dtype, scale=3.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


@pytest.mark.parametrize("dtype", TFLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1, 2, -3])
def test_softmax_against_torch(rng, dtype, dim):
    x = randn(rng, (5, 6, 7), dtype)
    xc = x.clone()
    y = softdot.softmax(x, axis=dim)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape
    assert_ulp(y.numpy(), softmax_ref(x.numpy(), axis=dim), 1)
    # torch in float64, rounded: one of the two floats around the exact value.
    if dtype == torch.float32:
        ref = torch.softmax(x.double(), dim=dim).float()
        assert_ulp(y.numpy(), ref.numpy(), 1)
    # torch in the same dtype: x - max rounds (relative error up to
    # |x - max| eps / 2 in a weight), exp and the sum a few eps.
    eps = torch.finfo(dtype).eps
    torch_err = (float(x.max() - x.min()) + 4) * eps
    torch.testing.assert_close(y, torch.softmax(x, dim=dim), rtol=torch_err, atol=0)
    lg = softdot.log_softmax(x, axis=dim)
    assert isinstance(lg, torch.Tensor) and lg.dtype == dtype
    assert_log_softmax_bound(lg.numpy(), x.numpy(), axis=dim)
    torch.testing.assert_close(lg, torch.log_softmax(x, dim=dim), rtol=2 * eps, atol=torch_err)
    torch.testing.assert_close(x, xc, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", TFLOATS)
def test_noncontiguous_tensors(rng, dtype):
    base = randn(rng, (8, 12, 10), dtype)
    for x in (
        base.transpose(0, 2),
        base[::2],
        base[:, :, ::3],
        base.permute(2, 0, 1),
        base.flip(0)[1:],
    ):
        for dim in (0, -1):
            y = softdot.softmax(x, axis=dim)
            assert_ulp(y.numpy(), softmax_ref(x.contiguous().numpy(), axis=dim), 1)
            torch_err = (float(x.max() - x.min()) + 4) * torch.finfo(dtype).eps
            torch.testing.assert_close(y, torch.softmax(x, dim=dim), rtol=torch_err, atol=0)


@pytest.mark.parametrize("dtype", TFLOATS)
def test_logsumexp_against_torch(rng, dtype):
    x = randn(rng, (4, 5, 6), dtype)
    for axis in (None, 0, -1, (0, 2)):
        r = softdot.logsumexp(x, axis=axis)
        assert isinstance(r, torch.Tensor) and r.dtype == dtype
        ref = logsumexp_ref(x.numpy(), axis=axis)
        assert_ulp(np.asarray(r.numpy()), np.asarray(ref), 2)
        tdim = tuple(range(3)) if axis is None else axis
        # torch's own error: a few eps of the max and of log(n) (absolute).
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(
            r, torch.logsumexp(x, dim=tdim), rtol=2 * eps, atol=4 * eps * (float(x.abs().max()) + 5)
        )
    r = softdot.logsumexp(x, axis=1, keepdims=True)
    assert r.shape == (4, 1, 6)


def test_special_values_torch_differs():
    x = torch.tensor([[-float("inf")] * 3, [float("inf"), 1.0, float("inf")]])
    y = softdot.softmax(x)
    torch.testing.assert_close(y, torch.tensor([[0.0, 0, 0], [0.5, 0, 0.5]]), rtol=0, atol=0)
    assert not torch.signbit(y).any()
    assert torch.isnan(torch.softmax(x, dim=-1)).all()  # torch's rule differs
    w = torch.tensor([True, False, True])
    y = softdot.softmax(torch.tensor([2.0, float("nan"), 0.1]), where=w)
    assert y[1] == 0 and not torch.isnan(y).any()


def test_torch_integers_and_other_functions(rng):
    x = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    y = softdot.softmax(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    assert_ulp(y.numpy(), softmax_ref(np.array([[1.0, 2.0, 3.0]])), 1)
    d = softdot.dot(torch.tensor([1.0, 2, 0]), torch.tensor([2.0, 1, 3]))
    assert isinstance(d, torch.Tensor) and d.ndim == 0 and d.item() == 4
    assert d.dtype == torch.float32
    q = randn(rng, (8,), torch.float64)
    keys = randn(rng, (5, 8), torch.float64)
    s = softdot.dots(q, keys)
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float64
    assert torch.equal(s, torch.stack([softdot.dot(q, k) for k in keys]))
    yy = softdot.softmax(randn(rng, (3, 9), torch.float64))
    dy = randn(rng, (3, 9), torch.float64)
    dx = softdot.softmax_backward(yy, dy)
    assert isinstance(dx, torch.Tensor)
    torch.testing.assert_close(
        dx, yy * (dy - (dy * yy).sum(-1, keepdim=True)), rtol=1e-12, atol=1e-15
    )
    c = randn(rng, (20,), torch.float32)
    s = softdot.softmax_state(c[:7]).merge(softdot.softmax_state(c[7:]))
    y = torch.cat([softdot.softmax_apply(c[:7], s), softdot.softmax_apply(c[7:], s)])
    assert isinstance(y, torch.Tensor)
    assert_ulp(y.numpy(), softmax_ref(c.numpy()), 1)


# ---- autograd -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", TFLOATS)
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_gradient_matches_torch(rng, dtype, dim):
    x0 = randn(rng, (6, 11), dtype)
    w = randn(rng, (6, 11), dtype, 1.0)
    x = x0.clone().requires_grad_()
    y = st.softmax(x, dim=dim)
    assert y.requires_grad and y.grad_fn is not None
    (y * w).sum().backward()
    xt = x0.clone().requires_grad_()
    (torch.softmax(xt, dim=dim) * w).sum().backward()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad, xt.grad, rtol=64 * eps, atol=16 * eps)
    # float64 torch as the reference for float32: softdot's gradient is exact
    # to about 1 ulp for its float y, whose weights are off by 0.5 ulp, so
    # |g_i - exact| <~ eps y_i (|w_i| + |s| + sum_j |w_j| y_j) with s = <w, y>.
    if dtype == torch.float32:
        xd = x0.double().requires_grad_()
        yd = torch.softmax(xd, dim=dim)
        (yd * w.double()).sum().backward()
        wd = w.double()
        sd_ = (wd * yd).sum(dim=dim, keepdim=True).abs()
        lim = (
            2
            * eps
            * yd.detach()
            * (wd.abs() + sd_ + (wd.abs() * yd.detach()).sum(dim=dim, keepdim=True))
            + 1e-30
        )
        assert torch.all((x.grad.double() - xd.grad).abs() <= lim)


@pytest.mark.parametrize("dtype", TFLOATS)
def test_log_softmax_gradient_matches_torch(rng, dtype):
    x0 = randn(rng, (5, 9), dtype)
    w = randn(rng, (5, 9), dtype, 1.0)
    x = x0.clone().requires_grad_()
    (st.log_softmax(x, dim=1) * w).sum().backward()
    xt = x0.clone().requires_grad_()
    (torch.log_softmax(xt, dim=1) * w).sum().backward()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad, xt.grad, rtol=64 * eps, atol=64 * eps)


def test_temperature_gradient(rng):
    x0 = randn(rng, (4, 7), torch.float64)
    w = randn(rng, (4, 7), torch.float64, 1.0)
    for T in (0.5, 2.0, 3.0):
        x = x0.clone().requires_grad_()
        (st.softmax(x, temperature=T) * w).sum().backward()
        xt = x0.clone().requires_grad_()
        (torch.softmax(xt / T, dim=-1) * w).sum().backward()
        torch.testing.assert_close(x.grad, xt.grad, rtol=1e-13, atol=1e-15)
        x = x0.clone().requires_grad_()
        (st.log_softmax(x, temperature=T) * w).sum().backward()
        xt = x0.clone().requires_grad_()
        (torch.log_softmax(xt / T, dim=-1) * w).sum().backward()
        torch.testing.assert_close(x.grad, xt.grad, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize(
    "fn,kw",
    [
        (st.softmax, {}),
        (st.softmax, {"dim": 0}),
        (st.softmax, {"temperature": 0.7}),
        (st.softmax, {"dim": 0, "temperature": 2.5, "precision": "fast"}),
        (st.log_softmax, {}),
        (st.log_softmax, {"dim": 0}),
        (st.log_softmax, {"temperature": 0.7}),
        (st.log_softmax, {"dim": 1, "temperature": 3.0}),
    ],
)
def test_gradcheck(rng, fn, kw):
    x = randn(rng, (4, 5, 3), torch.float64, 1.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fn(t, **kw), (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


def _penalty_grad(f, x0, w):
    """The gradient of a gradient penalty: g = d<f(x), w>/dx with the graph
    kept, then d(sum g^2)/dx."""
    x = x0.clone().requires_grad_()
    (g,) = torch.autograd.grad((f(x) * w).sum(), x, create_graph=True)
    (g**2).sum().backward()
    return g.detach(), x.grad


MASKED = float("-inf")


def _second_order_inputs(rng, dtype):
    x0 = randn(rng, (5, 9), dtype)
    x0[1, 3] = MASKED  # masked entries (weight 0), as masked_fill(-inf) makes them
    x0[4, ::2] = MASKED
    w = randn(rng, (5, 9), dtype, 1.0)
    return x0, w


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("T", [1.0, 0.7, 2.5])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_double_backward_matches_torch_float64(rng, dim, T, log):
    """A gradient penalty through softdot.torch equals torch's in float64, to
    a few ulp: the issue's case (row 0 was [3.081992, -0.586858, ...] where
    torch gives [2.817773, -0.534101, ...]), with -inf entries and temperature."""
    x0, w = _second_order_inputs(rng, torch.float64)
    if log:  # log-weights of masked entries are -inf; weight them by 0
        w = torch.where(torch.isinf(x0), torch.zeros_like(w), w)
        ours = _penalty_grad(lambda t: st.log_softmax(t, dim=dim, temperature=T), x0, w)
        ref = _penalty_grad(lambda t: torch.log_softmax(t / T, dim=dim), x0, w)
    else:
        ours = _penalty_grad(lambda t: st.softmax(t, dim=dim, temperature=T), x0, w)
        ref = _penalty_grad(lambda t: torch.softmax(t / T, dim=dim), x0, w)
    for a, b in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)
    assert (ours[1][torch.isinf(x0)] == 0).all()  # masked entries: no gradient


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_double_backward_matches_torch_float32(rng, log):
    x0, w = _second_order_inputs(rng, torch.float32)
    w = torch.where(torch.isinf(x0), torch.zeros_like(w), w)
    f, tf = (st.log_softmax, torch.log_softmax) if log else (st.softmax, torch.softmax)
    ours = _penalty_grad(lambda t: f(t, dim=1, temperature=0.7), x0, w)
    ref = _penalty_grad(lambda t: tf(t / 0.7, dim=1), x0.double(), w.double())
    for a, b in zip(ours, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_double_backward_issue_example():
    """The issue's penalty: softdot's row 0 was [3.081992, -0.586858, -4.357579,
    ...] where torch gives [2.817773, -0.534101, -4.35203, ...]."""
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 6, dtype=torch.float64, generator=gen) * 2
    w = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    ours = _penalty_grad(lambda t: st.softmax(t), x0, w)[1]
    ref = _penalty_grad(lambda t: torch.softmax(t, dim=-1), x0, w)[1]
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-15)
    # The dispatching front end (softdot.softmax on a tensor that requires grad).
    ours = _penalty_grad(lambda t: softdot.softmax(t), x0, w)[1]
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(
    "fn,kw",
    [
        (st.softmax, {}),
        (st.softmax, {"dim": 0, "temperature": 0.7}),
        (st.log_softmax, {}),
        (st.log_softmax, {"dim": 1, "temperature": 2.5}),
    ],
)
def test_gradgradcheck(rng, fn, kw):
    x = randn(rng, (3, 4, 2), torch.float64, 1.0).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: fn(t, **kw), (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_third_derivative_matches_torch(rng):
    x0 = randn(rng, (2, 5), torch.float64, 1.0)
    for f, tf in ((st.softmax, torch.softmax), (st.log_softmax, torch.log_softmax)):
        res = []
        ours = functools.partial(f, dim=-1, temperature=1.5)
        for g in (ours, lambda t, tf=tf: tf(t / 1.5, dim=-1)):
            x = x0.clone().requires_grad_()
            (g1,) = torch.autograd.grad(g(x)[:, 0].sum(), x, create_graph=True)
            (g2,) = torch.autograd.grad((g1 * g1).sum(), x, create_graph=True)
            (g3,) = torch.autograd.grad(g2[:, 1].sum(), x)
            res.append(g3)
        torch.testing.assert_close(res[0], res[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", TFLOATS)
def test_torch_func_grad(rng, dtype):
    x = randn(rng, (3, 7), dtype)
    eps = torch.finfo(dtype).eps
    g = torch.func.grad(lambda t: st.softmax(t)[..., 0].sum())(x)
    gt = torch.func.grad(lambda t: torch.softmax(t, dim=-1)[..., 0].sum())(x)
    torch.testing.assert_close(g, gt, rtol=16 * eps, atol=4 * eps)
    g = torch.func.grad(lambda t: st.log_softmax(t, temperature=2.0)[..., 2].sum())(x)
    gt = torch.func.grad(lambda t: torch.log_softmax(t / 2.0, dim=-1)[..., 2].sum())(x)
    torch.testing.assert_close(g, gt, rtol=16 * eps, atol=4 * eps)
    # grad of grad: the second derivative through torch.func.
    h = torch.func.grad(lambda t: torch.func.grad(lambda s: st.softmax(s)[0, 0])(t).sum())(x)
    ht = torch.func.grad(
        lambda t: torch.func.grad(lambda s: torch.softmax(s, dim=-1)[0, 0])(t).sum()
    )(x)
    torch.testing.assert_close(h, ht, rtol=64 * eps, atol=8 * eps)


def test_softmax_dispatches_to_autograd(rng):
    x = randn(rng, (3, 6), torch.float64).requires_grad_()
    for f, tf in ((softdot.softmax, torch.softmax), (softdot.log_softmax, torch.log_softmax)):
        y = f(x, axis=0)
        assert y.grad_fn is not None
        w = randn(rng, (3, 6), torch.float64)
        (gx,) = torch.autograd.grad((y * w).sum(), x)
        (gt,) = torch.autograd.grad((tf(x, dim=0) * w).sum(), x)
        torch.testing.assert_close(gx, gt, rtol=1e-13, atol=1e-15)
    with torch.no_grad():
        y = softdot.softmax(x)
    assert y.grad_fn is None and not y.requires_grad
    y = softdot.softmax(x.detach())
    assert y.grad_fn is None


def test_st_functions_reject_non_tensors():
    with pytest.raises(TypeError, match="torch.Tensor"):
        st.softmax(np.zeros(3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        st.log_softmax([1.0, 2.0])


@pytest.mark.parametrize(
    "call",
    [
        lambda t: softdot.logsumexp(t),
        lambda t: softdot.softmax_backward(t, t.detach()),
        lambda t: softdot.dot(t, t.detach()),
        lambda t: softdot.softmax_state(t),
    ],
)
def test_no_backward_raises_instead_of_dropping_the_graph(call):
    """Functions without a backward refuse a tensor that requires grad (a result
    without grad_fn would silently cut the graph); under no_grad they run."""
    t = torch.tensor([1.0, 2.0, 3.5], requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward"):
        call(t)
    with torch.no_grad():
        call(t)


# ---- the top-level functions through autograd, and gradients at special values ----------


@pytest.mark.parametrize(
    "kw",
    [{}, {"axis": 0}, {"temperature": 0.7}, {"axis": 1, "temperature": 2.5}],
)
def test_top_level_log_softmax_gradcheck(rng, kw):
    """softdot.log_softmax (not only softdot.torch.log_softmax) on a tensor
    that requires grad: softdot's Function, gradcheck and gradgradcheck."""
    x = randn(rng, (3, 4, 2), torch.float64, 1.0).requires_grad_()
    y = softdot.log_softmax(x, **kw)
    assert y.requires_grad and type(y.grad_fn) is st.LogSoftmax._backward_cls

    def f(t):
        return softdot.log_softmax(t, **kw)

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-7, rtol=1e-5)
    assert torch.autograd.gradgradcheck(f, (x,), eps=1e-6, atol=1e-7, rtol=1e-5)
    y = softdot.softmax(x, **kw)
    assert type(y.grad_fn) is st.Softmax._backward_cls


INF = float("inf")
NAN = float("nan")


def _special_rows(dtype):
    """Rows: some -inf; all -inf; two +inf; NaN; ordinary."""
    return torch.tensor(
        [
            [0.5, -INF, 2.0, -INF, 1.0],
            [-INF, -INF, -INF, -INF, -INF],
            [INF, 0.0, INF, 1.0, -INF],
            [1.0, NAN, 0.0, 2.0, 3.0],
            [0.25, -1.0, 2.0, 0.0, 1.5],
        ],
        dtype=dtype,
    )


def _grad_of(f, x0, dy):
    x = x0.clone().requires_grad_()
    f(x).backward(dy)
    return x.grad


def _limit_input(x0):
    """The +inf entries at 1e4: every other weight exactly 0 in float64."""
    return torch.where(torch.isinf(x0) & (x0 > 0), 1e4, x0).double()


@pytest.mark.parametrize("dtype", TFLOATS)
def test_softmax_gradient_special_values(rng, dtype):
    """Through softdot.softmax's autograd: -inf entries get exactly 0, also
    where dy is +-inf (never 0 * inf = NaN); a fully masked row zeros; +inf
    entries the limit's gradient; a NaN row NaN in that row only."""
    x0 = _special_rows(dtype)
    dy = randn(rng, x0.shape, dtype, 1.0)
    dy[0, 1], dy[1, 2], dy[2, 4] = INF, -INF, INF  # infinities at weight-0 entries
    g = _grad_of(softdot.softmax, x0, dy)
    masked = torch.isinf(x0) & (x0 < 0)
    assert (g[masked] == 0).all()
    assert (g[1] == 0).all()
    assert torch.isnan(g[3]).all()
    assert torch.isfinite(g[[0, 1, 2, 4]]).all()
    # Rows 0 and 2 as torch at finite logits (row 2's limit), dy 0 at the
    # weight-0 entries (what they contribute); row 4 as torch.
    dyf = torch.where(torch.isinf(dy), torch.zeros_like(dy), dy).double()
    xl = _limit_input(x0)
    gt = _grad_of(lambda t: torch.softmax(t, dim=-1), xl, dyf)
    tol = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(g[[0, 2, 4]].double(), gt[[0, 2, 4]], rtol=tol, atol=tol)
    # softmax_backward itself, several rows: the NaN row does not spread.
    y = softdot.softmax(x0)
    dx = softdot.softmax_backward(y, dy)
    assert torch.isnan(dx[3]).all() and not torch.isnan(dx[[0, 1, 2, 4]]).any()


@pytest.mark.parametrize("dtype", TFLOATS)
def test_log_softmax_gradient_special_values(rng, dtype):
    """Through softdot.log_softmax's autograd (dx = dy - p sum(dy)): a -inf
    logit has weight p = 0, so its gradient is dy_j exactly (the slope of
    x_j - lse is 1 - p_j); a fully masked row gives dx = dy (torch: NaN);
    +inf entries the limit; a NaN row NaN in that row only; an infinite dy at
    a weight-0 entry makes sum(dy) infinite but p * sum(dy) is 0 there."""
    x0 = _special_rows(dtype)
    dy = randn(rng, x0.shape, dtype, 1.0)
    g = _grad_of(softdot.log_softmax, x0, dy)
    masked = torch.isinf(x0) & (x0 < 0)
    assert torch.equal(g[masked], dy[masked])
    assert torch.equal(g[1], dy[1])
    assert torch.isnan(torch.log_softmax(x0[1], dim=-1)).all()  # torch's rule differs
    assert torch.isnan(g[3]).all()
    assert torch.isfinite(g[[0, 1, 2, 4]]).all()
    gt = _grad_of(lambda t: torch.log_softmax(t, dim=-1), _limit_input(x0), dy.double())
    tol = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(g[[0, 2, 4]].double(), gt[[0, 2, 4]], rtol=tol, atol=tol)
    # Infinite dy at weight-0 entries: those keep dy_j, the other entries of
    # the row get -inf (dy_i - p_i inf), never NaN.
    dyi = dy.clone()
    dyi[0, 1] = INF
    dyi[1, 0] = -INF
    g = _grad_of(softdot.log_softmax, x0, dyi)
    assert g[0, 1] == INF and (g[0, [0, 2, 4]] == -INF).all() and g[0, 3] == dy[0, 3]
    assert torch.equal(g[1], dyi[1])
    assert not torch.isnan(g[[0, 1, 2, 4]]).any()
