"""logsumexp on numpy arrays: every axis form (None, int, negative, tuple,
keepdims), every layout, where masks, temperature and out, against exact
references at the stated 2-ulp bound (mpmath where the result cancels),
the special-value table, and agreement with scipy.special.logsumexp."""

import numpy as np
import pytest
import scipy.special

import softdot

from conftest import (
    FLOATS,
    LAYOUTS,
    LAYOUTS_1D,
    assert_ulp,
    logsumexp_mp,
    logsumexp_ref,
    make_layout,
    ulp,
)

INF, NAN = np.inf, np.nan
SHAPES = {1: (53,), 2: (6, 21), 3: (3, 5, 13), 4: (2, 3, 4, 7)}


def data(rng, shape, dtype, scale=4.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def axis_forms(ndim):
    forms = [None] + list(range(ndim)) + list(range(-ndim, 0))
    if ndim >= 2:
        forms += [(0, ndim - 1), (-1, 0), tuple(range(ndim))]
    if ndim >= 3:
        forms += [(1, 2), (2, 0, 1)]
    return forms


ND_LAYOUTS = [(1, lay) for lay in LAYOUTS_1D] + [(nd, lay) for nd in (2, 3, 4) for lay in LAYOUTS]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ndim,layout", ND_LAYOUTS)
def test_every_axis_form(rng, dtype, ndim, layout):
    v = data(rng, SHAPES[ndim], dtype)
    x = make_layout(v, layout)
    before = x.copy()
    for axis in axis_forms(ndim):
        for keepdims in (False, True):
            r = softdot.logsumexp(x, axis=axis, keepdims=keepdims)
            ref = logsumexp_ref(v, axis=axis, keepdims=keepdims)
            assert np.shape(r) == np.shape(ref), (axis, keepdims)
            assert r.dtype == dtype
            # Within 2 ulp of exact: at most 2 from the rounded reference.
            assert_ulp(np.asarray(r), np.asarray(ref), 2)
            if keepdims:
                np.testing.assert_array_equal(
                    r, np.asarray(softdot.logsumexp(x, axis=axis)).reshape(r.shape)
                )
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("dtype", FLOATS)
def test_full_reduction_is_a_numpy_scalar(rng, dtype):
    x = data(rng, (4, 5, 6), dtype)
    r = softdot.logsumexp(x)
    assert type(r) is dtype  # np.float32 / np.float64, as scipy returns
    assert r == softdot.logsumexp(x, axis=(0, 1, 2))
    assert_ulp(np.asarray(r), np.asarray(logsumexp_ref(x)), 2)
    k = softdot.logsumexp(x, keepdims=True)
    assert type(k) is np.ndarray and k.shape == (1, 1, 1) and k[0, 0, 0] == r
    # A 0-d input: the logsumexp of one entry is the entry.
    assert softdot.logsumexp(np.array(3.5, dtype=dtype)) == dtype(3.5)
    assert type(softdot.logsumexp(np.array(3.5, dtype=dtype))) is dtype


def test_readme_row_lse():
    # exact: 1002.13284...; the README's float32 1002.1329 is the nearest
    # float32 (1002.132874), checked in test_backward_state_dot.
    r = softdot.logsumexp(np.array([1002, 1000, 997], dtype=np.float64))
    assert f"{float(r):.6f}" == "1002.132845"
    r32 = softdot.logsumexp(np.array([1002, 1000, 997], dtype=np.float32))
    assert_ulp(np.asarray(r32), np.asarray(np.float32(1002.132845)), 2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_out_and_keepdims(rng, dtype):
    x = data(rng, (4, 6, 5), dtype)
    out = np.full((4, 5), 7.0, dtype=dtype)
    r = softdot.logsumexp(x, axis=1, out=out)
    assert r is out
    assert_ulp(out, logsumexp_ref(x, axis=1), 2)
    outk = np.empty((1, 6, 1), dtype=dtype)
    r = softdot.logsumexp(x, axis=(0, 2), keepdims=True, out=outk)
    assert r is outk
    assert_ulp(outk, logsumexp_ref(x, axis=(0, 2), keepdims=True), 2)
    # A strided out (every other element of a buffer).
    buf = np.zeros((4, 10), dtype=dtype)
    r = softdot.logsumexp(x, axis=1, out=buf[:, ::2])
    assert np.shares_memory(r, buf)
    assert_ulp(buf[:, ::2], logsumexp_ref(x, axis=1), 2)
    assert np.all(buf[:, 1::2] == 0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("temperature", [2.0, 0.25, 0.7, 5.0])
def test_temperature(rng, dtype, temperature):
    x = data(rng, (9, 31), dtype)
    r = softdot.logsumexp(x, axis=-1, temperature=temperature)
    assert_ulp(r, logsumexp_ref(x, axis=-1, temperature=temperature), 2)
    if temperature in (2.0, 0.25):  # x / T exact
        np.testing.assert_array_equal(
            r, softdot.logsumexp((x / dtype(temperature)).astype(dtype), axis=-1)
        )


@pytest.mark.parametrize("dtype", FLOATS)
def test_where(rng, dtype):
    x = data(rng, (5, 4, 12), dtype)
    keep = rng.random(x.shape) < 0.6
    keep[..., 0] = True
    for axis in (-1, (0, 2), None):
        r = softdot.logsumexp(x, axis=axis, where=keep)
        ref = logsumexp_ref(x, axis=axis, where=keep)
        assert_ulp(np.asarray(r), np.asarray(ref), 2)
    # A broadcast row mask; masked entries equal entries of -inf.
    row = rng.random(12) < 0.5
    row[3] = True
    r = softdot.logsumexp(x, axis=-1, where=row)
    np.testing.assert_array_equal(r, softdot.logsumexp(np.where(row, x, -INF), axis=-1))
    assert_ulp(r, logsumexp_ref(x, axis=-1, where=row), 2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_cancellation_log_probabilities(rng, dtype):
    """logsumexp of log-probabilities is about 0: the result cancels, and the
    header promises 2 ulp (plus about 2^-64 |m| for double) by recomputing
    in the next wider type. "About": measured up to 3.6 x 2^-64 |m|, so the
    slack is 2^-62 |m| -- a plain double computation errs by ~2^-53 |m|."""
    z = rng.standard_normal((40, 16)) * 3
    lp = (z - scipy.special.logsumexp(z, axis=1, keepdims=True)).astype(dtype)
    r = softdot.logsumexp(lp, axis=1)
    for i in range(lp.shape[0]):
        exact = logsumexp_mp(lp[i])
        m = float(np.max(lp[i]))
        slack = 2.0**-62 * abs(m) if dtype == np.float64 else 0.0
        err = abs(float(r[i]) - float(exact))
        lim = 2 * float(ulp(dtype(float(exact)))) + slack
        assert err <= lim, (i, err, lim, float(exact))
    # The values are tiny: a plain m + log(sum) would be wrong by ~eps.
    assert np.max(np.abs(r)) < 1e-4


@pytest.mark.parametrize("dtype", FLOATS)
def test_special_values(dtype):
    x = np.array(
        [[1.0, -INF, 2.0], [-INF, -INF, -INF], [INF, 1.0, INF], [1.0, NAN, INF], [NAN, -INF, -INF]],
        dtype=dtype,
    )
    r = softdot.logsumexp(x, axis=1)
    assert_ulp(r[:1], logsumexp_ref(x[:1, [0, 2]], axis=1), 2)
    assert r[1] == -INF and r[2] == INF
    assert np.isnan(r[3]) and np.isnan(r[4])
    # Masked NaN is ignored; a fully masked row is -inf.
    keep = np.array([True, False, True])
    r = softdot.logsumexp(x[3], where=keep)
    assert r == INF
    r = softdot.logsumexp(np.array([NAN, 0.5, 1.5], dtype=dtype), where=[False, True, True])
    assert_ulp(np.asarray(r), np.asarray(logsumexp_ref(np.array([0.5, 1.5], dtype=dtype))), 2)
    assert softdot.logsumexp(x[0], where=np.zeros(3, dtype=bool)) == -INF
    # Overflow-free: huge entries.
    big = np.finfo(dtype).max
    r = softdot.logsumexp(np.array([big, big], dtype=dtype))
    assert np.isinf(r) or r == big  # log(2 big) overflows the type
    r = softdot.logsumexp(np.array([big, 0.0], dtype=dtype))
    assert r == big


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)])
def test_against_scipy(rng, dtype, axis):
    x = data(rng, (7, 9, 5), dtype)
    ref = scipy.special.logsumexp(x.astype(np.float64), axis=axis)
    r = softdot.logsumexp(x, axis=axis)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(r, ref, rtol=2 * eps + 8 * 2.0**-53, atol=0)
    b = rng.random(x.shape) < 0.5
    b[..., 0] = True
    # scipy's `b` weights (0 or 1) are softdot's where.
    ref = scipy.special.logsumexp(x.astype(np.float64), axis=axis, b=b.astype(np.float64))
    np.testing.assert_allclose(
        softdot.logsumexp(x, axis=axis, where=b), ref, rtol=2 * eps + 8 * 2.0**-53, atol=0
    )


def test_zero_d_reduces_along_axis_0_or_minus_1():
    """A 0-d x is one entry: logsumexp is that entry for axis None, 0 or -1
    (as scipy.special.logsumexp)."""
    for axis in (None, 0, -1, (0,)):
        assert softdot.logsumexp(np.float32(2.5), axis=axis) == np.float32(2.5)


@pytest.mark.xfail(
    strict=True,
    reason="known limitation, docs/limits.md: the rounding "
    "error of x * (1/T) enters exp as a correction; beyond about 88 "
    "(float32) it overflows",
)
def test_huge_scores_with_inexact_inverse_temperature():
    """[1e20, 0] at T = 3: the exact logsumexp is 1e20 / 3 and log_softmax
    [0, -1e20 / 3]; softdot gives -inf and NaN today."""
    x = np.array([1e20, 0.0], dtype=np.float32)
    want = np.float32(np.float64(x[0]) * np.float64(np.float32(1 / 3)))
    assert softdot.logsumexp(x, temperature=3.0) == pytest.approx(want, rel=2**-22)
    ls = softdot.log_softmax(x, temperature=3.0)
    assert ls[0] == 0.0 and ls[1] == pytest.approx(-want, rel=2**-22)
