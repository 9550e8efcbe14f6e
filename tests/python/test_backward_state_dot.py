"""softmax_backward against the exact gradient (Fractions) at the stated
bound, the online softmax (softmax_state / merge / softmax_apply /
SoftmaxState.logsumexp / identity), and dot / dot(accurate=True) / dots
against exact dot products at the headers' bounds, on numpy arrays."""

import math
from fractions import Fraction

import numpy as np
import pytest

import softdot
from softdot import SoftmaxState

from conftest import (
    FLOATS,
    LAYOUTS,
    assert_ulp,
    dot_exact,
    frac_array,
    gamma,
    logsumexp_ref,
    make_layout,
    softmax_backward_exact,
    softmax_ref,
    ulp,
)

INF, NAN = np.inf, np.nan


# ---- softmax_backward ----------------------------------------------------------------


def assert_backward_bound(dx, y, dy):
    """docs/accuracy.md: about 1 ulp of dx_i beyond an allowance of
    2 * 2^-53 |y_i <dy, y>| for the rounding of the inner product (float:
    measured 0.50 ulp, double: 0.49 ulp beyond the allowance)."""
    exact, s = softmax_backward_exact(y, dy)
    err = np.abs(frac_array(dx) - exact).astype(np.float64)
    ex = exact.astype(np.float64)
    yf = np.asarray(y, dtype=np.float64)
    lim = ulp(ex.astype(dx.dtype)).astype(np.float64) + 2 * 2.0**-53 * np.abs(
        yf * s.astype(np.float64)
    )
    bad = ~(err <= lim)
    assert not bad.any(), (np.argwhere(bad)[:3].tolist(), float(np.max(err / lim)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_exact(rng, dtype, layout):
    y0 = softmax_ref(rng.standard_normal((6, 23)) * 3).astype(dtype)
    dy0 = rng.standard_normal((6, 23)).astype(dtype)
    y, dy = make_layout(y0, layout), make_layout(dy0, "C")
    ycopy, dycopy = y.copy(), dy.copy()
    dx = softdot.softmax_backward(y, dy)
    assert dx.dtype == dtype and dx.shape == y0.shape
    assert_backward_bound(dx, y0, dy0)
    np.testing.assert_array_equal(y, ycopy)
    np.testing.assert_array_equal(dy, dycopy)


@pytest.mark.parametrize("dtype", FLOATS)
def test_backward_axes(rng, dtype):
    x = (rng.standard_normal((4, 5, 6)) * 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    for axis in (0, 1, 2, -1, -2, -3):
        y = softmax_ref(x, axis=axis)
        dx = softdot.softmax_backward(y, dy, axis=axis)
        ym = np.moveaxis(y, axis, -1)
        dym = np.moveaxis(dy, axis, -1)
        dxm = np.moveaxis(dx, axis, -1)
        assert_backward_bound(
            dxm.reshape(-1, ym.shape[-1]),
            ym.reshape(-1, ym.shape[-1]),
            dym.reshape(-1, ym.shape[-1]),
        )


@pytest.mark.parametrize("dtype", FLOATS)
def test_backward_ill_conditioned(dtype):
    """dy nearly constant: dx is tiny and comes from the last bits of dy."""
    eps = np.finfo(dtype).eps
    y = np.array([0.25, 0.75], dtype=dtype)
    dy = np.array([1.0, 1.0 + eps], dtype=dtype)
    dx = softdot.softmax_backward(y, dy)
    assert_backward_bound(dx, y, dy)
    assert dx[0] < 0


def test_backward_of_constant_gradient_is_zero(rng):
    y = softmax_ref(rng.standard_normal((3, 8)))
    dx = softdot.softmax_backward(y, np.full_like(y, 2.5))
    assert np.max(np.abs(dx)) <= 4 * 2.0**-53 * 2.5


def test_backward_nan_inf_ieee():
    y = np.array([0.5, 0.5, 0.0])
    dx = softdot.softmax_backward(y, np.array([1.0, NAN, 2.0]))
    assert np.isnan(dx).all()
    dx = softdot.softmax_backward(y, np.array([1.0, INF, 2.0]))
    assert np.isnan(dx[1]) or np.isinf(dx[1])


def test_backward_matches_finite_difference():
    x = np.array([0.3, -1.2, 2.0, 0.7])
    dy = np.array([0.5, -0.25, 1.0, 2.0])
    y = softdot.softmax(x)
    dx = softdot.softmax_backward(y, dy)
    h = 1e-6
    for i in range(4):
        e = np.zeros(4)
        e[i] = h
        fd = (dy @ softdot.softmax(x + e) - dy @ softdot.softmax(x - e)) / (2 * h)
        assert dx[i] == pytest.approx(fd, abs=1e-8)


# ---- online softmax -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_readme_chunked_example(dtype):
    row = np.array([1002, 1000, 997], dtype=dtype)
    a, b = row[:2], row[2:]
    s = softdot.softmax_state(a).merge(softdot.softmax_state(b))
    y = np.concatenate([softdot.softmax_apply(a, s), softdot.softmax_apply(b, s)])
    assert [f"{v:.4f}" for v in y] == ["0.8756", "0.1185", "0.0059"]
    # exact 1002.132845...; the nearest float32 is 1002.132874 (the README's
    # 1002.1329), the nearest float64 prints 1002.1328.
    assert f"{float(s.logsumexp()):.4f}" == ("1002.1329" if dtype == np.float32 else "1002.1328")
    assert_ulp(np.asarray(s.logsumexp()), np.asarray(logsumexp_ref(row)), 2)
    assert type(s.logsumexp()) is dtype
    assert s.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cuts", [(0,), (1,), (5, 5, 17), (3, 40, 41, 90), (64,)])
def test_chunks_merge_to_whole_row(rng, dtype, cuts):
    x = (rng.standard_normal(128) * 6).astype(dtype)
    bounds = [0, *cuts, len(x)]
    chunks = [x[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    total = SoftmaxState.identity(dtype)
    for c in chunks:
        total = total.merge(softdot.softmax_state(c))
    y = np.concatenate([softdot.softmax_apply(c, total) for c in chunks])
    assert_ulp(y, softmax_ref(x), 1)
    assert_ulp(y, softdot.softmax(x), 1)
    assert_ulp(np.asarray(total.logsumexp()), np.asarray(logsumexp_ref(x)), 2)
    assert total.max == float(x.max())


@pytest.mark.parametrize("dtype", FLOATS)
def test_merge_commutative_and_identity_bitwise(rng, dtype):
    a = softdot.softmax_state((rng.standard_normal(30) * 5).astype(dtype))
    b = softdot.softmax_state((rng.standard_normal(17) * 5 + 3).astype(dtype))
    assert a.merge(b) == b.merge(a)
    e = SoftmaxState.identity(dtype)
    assert e.max == -math.inf and e.sum == 0 and e.sum_lo == 0
    assert a.merge(e) == a and e.merge(a) == a
    empty = softdot.softmax_state(np.array([], dtype=dtype))
    assert empty == e
    masked = softdot.softmax_state(np.array([1.0, 2.0], dtype=dtype), where=[False, False])
    assert masked == e
    c = softdot.softmax_state((rng.standard_normal(9) * 5 - 2).astype(dtype))
    l, r = a.merge(b).merge(c), a.merge(b.merge(c))
    assert l.max == r.max
    assert abs((l.sum + l.sum_lo) - (r.sum + r.sum_lo)) <= 1e-18 * (l.sum + l.sum_lo)


@pytest.mark.parametrize("dtype", FLOATS)
def test_state_fields(dtype):
    s = softdot.softmax_state(np.array([1.0, 3.0, 2.0], dtype=dtype))
    assert s.max == 3.0
    ex = 1 + math.exp(-1) + math.exp(-2)
    # float chunks: exp to about 2^-31 relative (docs/accuracy.md), plenty
    # for float weights; double chunks: a double-length sum.
    tol = 2.0**-29 if dtype == np.float32 else 2.0**-51
    assert abs((s.sum + s.sum_lo) - ex) <= tol * ex
    assert "SoftmaxState(" in repr(s) and np.dtype(dtype).name in repr(s)
    # +inf entries: the sum counts them; NaN makes max and sum NaN.
    s = softdot.softmax_state(np.array([INF, 1.0, INF, INF], dtype=dtype))
    assert s.max == INF and s.sum == 3
    s = softdot.softmax_state(np.array([1.0, NAN], dtype=dtype))
    assert math.isnan(s.max) and math.isnan(s.sum)
    s = softdot.softmax_state(np.array([1.0, NAN], dtype=dtype), where=[True, False])
    assert s.max == 1.0 and s.sum == 1.0


@pytest.mark.parametrize("dtype", FLOATS)
def test_state_where_and_temperature(rng, dtype):
    x = (rng.standard_normal(50) * 4).astype(dtype)
    keep = rng.random(50) < 0.6
    keep[0] = True
    T = 0.5
    parts = [(x[:20], keep[:20]), (x[20:], keep[20:])]
    total = SoftmaxState.identity(dtype)
    for c, k in parts:
        total = total.merge(softdot.softmax_state(c, where=k, temperature=T))
    y = np.concatenate([softdot.softmax_apply(c, total, where=k, temperature=T) for c, k in parts])
    assert_ulp(y, softmax_ref(x, where=keep, temperature=T), 1)
    assert np.all(y[~keep] == 0)
    lse = total.logsumexp()
    assert_ulp(np.asarray(lse), np.asarray(logsumexp_ref(x, where=keep, temperature=T)), 2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_state_special_rows(dtype):
    parts = [np.array([1.0, INF], dtype=dtype), np.array([INF, -3.0], dtype=dtype)]
    total = softdot.softmax_state(parts[0]).merge(softdot.softmax_state(parts[1]))
    y = np.concatenate([softdot.softmax_apply(c, total) for c in parts])
    np.testing.assert_array_equal(y, np.array([0, 0.5, 0.5, 0], dtype=dtype))
    assert total.logsumexp() == INF
    parts = [np.full(3, -INF, dtype=dtype), np.full(2, -INF, dtype=dtype)]
    total = softdot.softmax_state(parts[0]).merge(softdot.softmax_state(parts[1]))
    assert total.logsumexp() == -INF
    y = np.concatenate([softdot.softmax_apply(c, total) for c in parts])
    assert np.all(y == 0) and not np.signbit(y).any()
    nan_total = softdot.softmax_state(np.array([NAN], dtype=dtype)).merge(total)
    assert np.isnan(softdot.softmax_apply(np.array([1.0], dtype=dtype), nan_total)).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_apply_out_and_in_place(rng, dtype):
    x = (rng.standard_normal(33) * 3).astype(dtype)
    s = softdot.softmax_state(x)
    out = np.empty_like(x)
    r = softdot.softmax_apply(x, s, out=out)
    assert r is out
    assert_ulp(out, softmax_ref(x), 1)
    y = x.copy()
    r = softdot.softmax_apply(y, s, out=y)
    assert r is y
    np.testing.assert_array_equal(y, out)
    # A strided chunk is read correctly (copied to a contiguous row).
    big = np.repeat(x, 2)
    r = softdot.softmax_apply(big[::2], s)
    np.testing.assert_array_equal(r, out)
    assert softdot.softmax_state(big[::2]) == s


# ---- dot products -----------------------------------------------------------------------


def test_dot_readme():
    assert softdot.dot(np.array([1.0, 2, 0]), np.array([2.0, 1, 3])) == 4
    r = softdot.dot(np.array([1, 2, 0], dtype=np.float32), np.array([2, 1, 3], dtype=np.float32))
    assert r == 4 and type(r) is np.float32
    r = softdot.dot(np.array([1, 2, 0]), np.array([2, 1, 3]))  # integers: float64
    assert r == 4 and type(r) is np.float64
    assert softdot.dot(np.array([1.0, 2, 0]), np.array([2.0, 1, 3]), accurate=True) == 4


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 7, 64, 129, 1000, 5000])
def test_dot_bounds(rng, dtype, n):
    u = 2.0**-24 if dtype == np.float32 else 2.0**-53
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    exact = dot_exact(x, y)
    absum = float(sum(abs(Fraction(float(a)) * Fraction(float(b))) for a, b in zip(x, y)))
    r = softdot.dot(x, y)
    assert type(r) is dtype
    assert abs(Fraction(float(r)) - exact) <= Fraction(gamma(n, u) * absum)
    ra = softdot.dot(x, y, accurate=True)
    assert type(ra) is dtype
    assert abs(Fraction(float(ra)) - exact) <= Fraction(
        u * abs(float(exact)) + gamma(n, u) ** 2 * absum
    )


@pytest.mark.parametrize("dtype", FLOATS)
def test_dot_accurate_ill_conditioned(rng, dtype):
    """Cancelling sums: dot(accurate=True) is as if computed in twice the
    precision and rounded once."""
    u = 2.0**-24 if dtype == np.float32 else 2.0**-53
    big = 2.0**20 if dtype == np.float32 else 2.0**50
    for _trial in range(20):
        n = 50
        x = rng.standard_normal(n).astype(dtype)
        y = rng.standard_normal(n).astype(dtype)
        x[:10] *= big
        x[10:20] = -x[:10]
        y[10:20] = y[:10]
        x, y = x[rng.permutation(n)], y[rng.permutation(n)]
        exact = dot_exact(x, y)
        absum = float(sum(abs(Fraction(float(a)) * Fraction(float(b))) for a, b in zip(x, y)))
        ra = softdot.dot(x, y, accurate=True)
        assert abs(Fraction(float(ra)) - exact) <= Fraction(
            u * abs(float(exact)) + gamma(n, u) ** 2 * absum
        )
    x = np.array(
        [1e20 if dtype == np.float64 else 1e10, 1.0, -1e20 if dtype == np.float64 else -1e10],
        dtype=dtype,
    )
    assert softdot.dot(x, np.ones(3, dtype=dtype), accurate=True) == 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_dot_same_bits_every_alignment(rng, dtype):
    x = rng.standard_normal(300).astype(dtype)
    y = rng.standard_normal(300).astype(dtype)
    r = softdot.dot(x, y)
    buf_x = np.zeros(301, dtype=dtype)
    buf_y = np.zeros(301, dtype=dtype)
    buf_x[1:] = x
    buf_y[1:] = y
    assert softdot.dot(buf_x[1:], buf_y[1:]) == r
    # A strided input is copied, same bits.
    sx = np.zeros(600, dtype=dtype)
    sx[::2] = x
    assert softdot.dot(sx[::2], y) == r
    assert softdot.dot(x[::-1].copy()[::-1], y) == r


def test_dot_special_values():
    assert np.isnan(softdot.dot(np.array([1.0, NAN]), np.array([1.0, 1.0])))
    assert np.isnan(softdot.dot(np.array([INF, 1.0]), np.array([0.0, 1.0])))
    assert softdot.dot(np.array([INF, 1.0]), np.array([1.0, 1.0])) == INF
    assert softdot.dot(np.array([], dtype=np.float32), np.array([], dtype=np.float32)) == 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_dots_bitwise_per_row(rng, dtype):
    q = rng.standard_normal(70).astype(dtype)
    keys = rng.standard_normal((33, 70)).astype(dtype)
    r = softdot.dots(q, keys)
    assert r.dtype == dtype and r.shape == (33,)
    np.testing.assert_array_equal(r, [softdot.dot(q, k) for k in keys])
    # Row stride larger than the row (a column slice); out given, strided.
    wide = rng.standard_normal((33, 100)).astype(dtype)
    ks = wide[:, 10:80]
    out = np.zeros(66, dtype=dtype)
    rr = softdot.dots(q, ks, out=out[::2])
    assert np.shares_memory(rr, out)
    np.testing.assert_array_equal(out[::2], [softdot.dot(q, k.copy()) for k in ks])
    assert np.all(out[1::2] == 0)
    # Every other row; F-ordered keys (copied).
    np.testing.assert_array_equal(
        softdot.dots(q, wide[::2, :70]), [softdot.dot(q, k.copy()) for k in wide[::2, :70]]
    )
    kf = np.asfortranarray(keys)
    np.testing.assert_array_equal(softdot.dots(q, kf), r)
    o = np.empty(33, dtype=dtype)
    assert softdot.dots(q, keys, out=o) is o
    np.testing.assert_array_equal(o, r)
