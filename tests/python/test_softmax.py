"""softmax and log_softmax on numpy arrays: the worked examples, exact
(wide-precision) references at the stated ulp bounds for every axis form and
memory layout (C, F, strided, negative strides) in 1 to 4 dimensions, where
masks, temperature, dtype conversion, the special-value table, and
agreement with scipy.special."""

import numpy as np
import pytest
import scipy.special

import softdot

from conftest import (
    FLOATS,
    LAYOUTS,
    LAYOUTS_1D,
    assert_log_softmax_bound,
    assert_ulp,
    log_softmax_ref,
    make_layout,
    softmax_ref,
)

INF, NAN = np.inf, np.nan

# Faithful: each weight within 1 ulp of the exact one; the reference is the
# exact weight rounded once, so the two floats differ by at most 1 ulp. Fast:
# within 2 ulp of exact (with FMA), so at most 2 from the rounded reference.
MAXULP = {"faithful": 1, "fast": 2}

SHAPES = {1: (37,), 2: (5, 33), 3: (3, 4, 17), 4: (2, 3, 2, 9)}


def data(rng, shape, dtype, scale=4.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---- the worked examples --------------------------------------------------------


def digits(y, n):
    """The values as printf("%.nf") prints them (the README's output)."""
    return [f"{float(v):.{n}f}" for v in np.asarray(y).ravel()]


@pytest.mark.parametrize("dtype", FLOATS)
def test_worked_examples(dtype):
    x = np.array([2.0, 1.0, 0.1], dtype=dtype)
    assert digits(softdot.softmax(x), 3) == ["0.659", "0.242", "0.099"]
    y = softdot.softmax(np.array([1002, 1000, 997], dtype=dtype))
    assert digits(y, 4) == ["0.8756", "0.1185", "0.0059"]
    m = softdot.softmax(x, where=np.array([1, 0, 1], dtype=bool))
    assert digits(m, 3) == ["0.870", "0.000", "0.130"]
    assert m[1] == 0 and not np.signbit(m[1])
    t = softdot.softmax(x, temperature=2)
    assert digits(t, 3) == ["0.502", "0.304", "0.194"]
    lg = softdot.log_softmax(x)
    assert digits(lg, 3) == ["-0.417", "-1.417", "-2.317"]
    for r in (y, m, t, lg):
        assert r.dtype == dtype


def test_readme_rows_example():
    m = np.array([[2, 1, 0.1], [1002, 1000, 997]], dtype=np.float32)
    keep = np.array([True, True, False])
    out = softdot.softmax(m, where=keep)
    assert digits(out[0], 4) == ["0.7311", "0.2689", "0.0000"]
    assert digits(out[1], 4) == ["0.8808", "0.1192", "0.0000"]


# ---- exact references, every axis and layout ------------------------------------------


@pytest.mark.parametrize("precision", ["faithful", "fast"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS_1D)
def test_softmax_1d(rng, dtype, precision, layout):
    v = data(rng, (301,), dtype)
    x = make_layout(v, layout)
    before = x.copy()
    for axis in (0, -1):
        y = softdot.softmax(x, axis=axis, precision=precision)
        assert type(y) is np.ndarray and y.dtype == dtype and y.shape == x.shape
        assert_ulp(y, softmax_ref(v), MAXULP[precision])
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("precision", ["faithful", "fast"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ndim", [2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_nd_every_axis(rng, dtype, precision, ndim, layout):
    v = data(rng, SHAPES[ndim], dtype)
    x = make_layout(v, layout)
    before = x.copy()
    for axis in list(range(ndim)) + list(range(-ndim, 0)):
        y = softdot.softmax(x, axis=axis, precision=precision)
        assert y.shape == v.shape and y.dtype == dtype
        assert_ulp(y, softmax_ref(v, axis=axis), MAXULP[precision])
        # Each slice along the axis sums to 1 within n ulp.
        np.testing.assert_allclose(
            y.astype(np.float64).sum(axis=axis),
            1.0,
            rtol=0,
            atol=4 * v.shape[axis] * np.finfo(dtype).eps,
        )
    np.testing.assert_array_equal(x, before)


ND_LAYOUTS = [(1, lay) for lay in LAYOUTS_1D] + [(nd, lay) for nd in (2, 3, 4) for lay in LAYOUTS]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ndim,layout", ND_LAYOUTS)
def test_log_softmax_every_axis(rng, dtype, ndim, layout):
    v = data(rng, SHAPES[ndim], dtype)
    x = make_layout(v, layout)
    before = x.copy()
    for axis in list(range(ndim)) + list(range(-ndim, 0)):
        y = softdot.log_softmax(x, axis=axis)
        assert y.shape == v.shape and y.dtype == dtype
        assert_log_softmax_bound(y, v, axis=axis)
        # And within 2 ulp of the rounded exact value (a single rounding).
        assert_ulp(y, log_softmax_ref(v, axis=axis), 2)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_softmax_dominant_entry(dtype):
    """The max entry's log-weight is -L with L tiny: the double-length L keeps
    it accurate to a few ulp of itself, not of 1."""
    x = np.array([0.0, -25.0, -30.0, -28.5], dtype=dtype)
    y = softdot.log_softmax(x)
    ref = log_softmax_ref(x)
    assert_ulp(y, ref, 2)
    assert -1e-10 < y[0] < 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_wide_range_and_underflow(rng, dtype):
    """Weights spanning many binades, down to subnormals (gradual underflow is
    kept, not flushed to zero)."""
    lo = -100.0 if dtype == np.float32 else -740.0
    x = np.linspace(lo, 0.0, 64).astype(dtype)
    y = softdot.softmax(x)
    ref = softmax_ref(x)
    assert_ulp(y, ref, 1)
    tiny = np.finfo(dtype).smallest_normal
    assert np.any((ref > 0) & (ref < tiny)), "the test wants subnormal weights"
    assert np.all((y > 0) == (ref > 0))


# ---- options -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("temperature", [2.0, 0.5, 0.7, 3.3, 1e-3])
def test_temperature(rng, dtype, temperature):
    x = data(rng, (7, 40), dtype, scale=3.0)
    if temperature < 0.01:
        x = x * dtype(1e-3)
    y = softdot.softmax(x, temperature=temperature)
    assert_ulp(y, softmax_ref(x, temperature=temperature), 1)
    lg = softdot.log_softmax(x, temperature=temperature)
    assert_log_softmax_bound(lg, x, temperature=temperature)
    assert np.all(lg <= 0)
    if temperature in (2.0, 0.5):  # 1/T is a power of two: x/T is exact
        assert_ulp(y, softdot.softmax((x / dtype(temperature)).astype(dtype)), 0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("temperature", [0.7, 0.3, 1.1])
def test_log_softmax_temperature_max_entry(dtype, temperature):
    """A single-entry row has weight exactly 1, and log-weight 0 within the
    stated absolute allowance (docs/accuracy.md, "Known limits": the low part
    of x * (1/T) enters the shift but not the sum), never above 0."""
    small = 2.0**-23 if dtype == np.float32 else 2.0**-52
    for v in (21.4, -21.4, -1.3, 5.1, -182.73804):
        one = softdot.log_softmax(np.array([v], dtype=dtype), temperature=temperature)
        assert -small <= one[0] <= 0, f"x = [{v}]: {one[0]!r}"
        assert softdot.softmax(np.array([v], dtype=dtype), temperature=temperature)[0] == 1
        assert softdot.log_softmax(np.array([v], dtype=dtype))[0] == 0  # T = 1: exact
    for x in (np.array([21.4, -21.3], dtype=dtype), np.array([8.5, 6.5], dtype=dtype)):
        lg = softdot.log_softmax(x, temperature=temperature)
        assert np.all(lg <= 0), lg
        assert_log_softmax_bound(lg, x, temperature=temperature)


@pytest.mark.parametrize("dtype", FLOATS)
def test_where_broadcast_and_full(rng, dtype):
    x = data(rng, (6, 5, 11), dtype)
    # A row mask broadcast over the leading axes.
    keep_row = rng.random(11) < 0.6
    keep_row[0] = True
    y = softdot.softmax(x, where=keep_row)
    assert_ulp(y, softmax_ref(x, where=keep_row), 1)
    assert np.all(y[..., ~keep_row] == 0) and not np.signbit(y[..., ~keep_row]).any()
    # A full mask, and one along axis 0.
    keep = rng.random(x.shape) < 0.7
    keep[..., 0] = True
    assert_ulp(softdot.softmax(x, where=keep), softmax_ref(x, where=keep), 1)
    keep0 = rng.random(x.shape) < 0.7
    keep0[0] = True
    assert_ulp(softdot.softmax(x, axis=0, where=keep0), softmax_ref(x, axis=0, where=keep0), 1)
    lg = softdot.log_softmax(x, axis=0, where=keep0)
    assert np.all(lg[~keep0] == -INF)
    assert_log_softmax_bound(lg, x, axis=0, where=keep0)
    # A masked entry equals an entry of -inf.
    xm = np.where(keep, x, -INF).astype(dtype)
    assert_ulp(softdot.softmax(xm), softdot.softmax(x, where=keep), 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_shift_invariance_bits(rng, dtype):
    x = rng.integers(-40, 40, size=(8, 50)).astype(dtype)
    for c in (1024.0, -64.0, 2.0**20):
        np.testing.assert_array_equal(softdot.softmax(x + dtype(c)), softdot.softmax(x))
        np.testing.assert_array_equal(
            softdot.softmax(x + dtype(c), precision="fast"), softdot.softmax(x, precision="fast")
        )


@pytest.mark.parametrize("src", [np.int8, np.int32, np.int64, np.uint16, np.bool_])
def test_integers_become_float64(src):
    x = np.array([[1, 2, 3], [0, 1, 1]]).astype(src)
    y = softdot.softmax(x)
    assert y.dtype == np.float64
    assert_ulp(y, softmax_ref(x.astype(np.float64)), 1)
    assert softdot.log_softmax(x).dtype == np.float64


def test_lists_and_scalars_of_python():
    y = softdot.softmax([1, 2, 3])
    assert type(y) is np.ndarray and y.dtype == np.float64
    assert_ulp(y, softmax_ref(np.array([1.0, 2.0, 3.0])), 1)
    y = softdot.softmax([[1.0, 2.0], [3.0, 5.0]], axis=0)
    assert_ulp(y, softmax_ref(np.array([[1.0, 2.0], [3.0, 5.0]]), axis=0), 1)


def test_large_matrix_threads(rng):
    """More than 2^18 elements: rows split across threads, same bits as row by
    row."""
    x = data(rng, (1024, 300), np.float32)
    y = softdot.softmax(x)
    for i in (0, 1, 511, 1023):
        np.testing.assert_array_equal(y[i], softdot.softmax(x[i]))
    assert_ulp(y[::97], softmax_ref(x[::97]), 1)


# ---- special values --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_fully_masked_rows_are_positive_zero(dtype):
    x = np.array([[-INF, -INF, -INF], [1.0, 2.0, 3.0], [NAN, 1.0, INF]], dtype=dtype)
    keep = np.array([[True, True, True], [False, False, False], [False, False, False]])
    y = softdot.softmax(x, where=keep)
    assert np.all(y == 0) and not np.signbit(y).any()
    lg = softdot.log_softmax(x, where=keep)
    assert np.all(lg == -INF)
    lse = softdot.logsumexp(x, axis=1, where=keep)
    np.testing.assert_array_equal(lse, [-INF, -INF, -INF])
    for p in ("faithful", "fast"):
        y = softdot.softmax(np.full(5, -INF, dtype=dtype), precision=p)
        assert np.all(y == 0) and not np.signbit(y).any()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_k_infinities_share_the_weight(dtype, k):
    x = np.array([0.5, -2.0, 7.0, 1e30, -INF, 3.0], dtype=dtype)
    pos = [1, 3, 5, 0, 2][:k]
    x[pos] = INF
    for p in ("faithful", "fast"):
        y = softdot.softmax(x, precision=p)
        expect = np.where(np.isposinf(x), dtype(1) / dtype(k), 0).astype(dtype)
        np.testing.assert_array_equal(y, expect)
        assert not np.signbit(y).any()
    lg = softdot.log_softmax(x)
    expect = np.where(np.isposinf(x), -np.log(dtype(k)), -INF).astype(dtype)
    assert_ulp(lg, expect, 1)
    if k == 1:
        assert lg[pos[0]] == 0 and not np.signbit(lg[pos[0]])
    assert softdot.logsumexp(x) == INF


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_kept_poisons_row_masked_nan_ignored(dtype):
    x = np.array([[1.0, NAN, 2.0, INF], [1.0, 2.0, 3.0, 4.0], [-INF, -INF, NAN, -INF]], dtype=dtype)
    for p in ("faithful", "fast"):
        y = softdot.softmax(x, precision=p)
        assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
        assert_ulp(y[1], softmax_ref(x[1]), 2)
    assert np.isnan(softdot.log_softmax(x)[[0, 2]]).all()
    assert np.isnan(softdot.logsumexp(x, axis=1)[[0, 2]]).all()
    keep = np.array([True, False, True, True])  # masks row 0's NaN, keeps row 2's
    y = softdot.softmax(x, where=keep)
    np.testing.assert_array_equal(y[0], np.array([0, 0, 0, 1], dtype=dtype))
    assert_ulp(y[1], softmax_ref(x[1], where=keep), 1)
    assert np.isnan(y[2]).all()
    # Row 2 with its NaN masked: every kept entry -inf, so +0.0 weights.
    y = softdot.softmax(x[2], where=np.array([True, True, False, True]))
    np.testing.assert_array_equal(y, np.zeros(4, dtype=dtype))
    assert not np.signbit(y).any()
    lg = softdot.log_softmax(x[2], where=np.array([True, True, False, True]))
    np.testing.assert_array_equal(lg, np.full(4, -INF, dtype=dtype))
    keep2 = np.array([True, False, True, False])
    y = softdot.softmax(x[0], where=keep2)
    assert_ulp(y, softmax_ref(np.array([1.0, 0, 2.0, 0], dtype=dtype), where=keep2), 1)
    assert y[1] == 0 and y[3] == 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_minus_inf_entries_get_exactly_zero(dtype, rng):
    x = data(rng, (4, 20), dtype)
    x[:, ::3] = -INF
    y = softdot.softmax(x)
    assert np.all(y[:, ::3] == 0) and not np.signbit(y[:, ::3]).any()
    finite = np.isfinite(x)
    rest = np.where(finite, x, 0)
    assert_ulp(y, softmax_ref(rest, where=finite), 1)
    lg = softdot.log_softmax(x)
    assert np.all(lg[:, ::3] == -INF)
    assert_log_softmax_bound(lg, rest, where=finite)


@pytest.mark.parametrize("dtype", FLOATS)
def test_overflow_free(dtype):
    big = np.finfo(dtype).max
    x = np.array([big, big / 2, -big, 0.0], dtype=dtype)
    y = softdot.softmax(x)
    np.testing.assert_array_equal(y, np.array([1, 0, 0, 0], dtype=dtype))
    lg = softdot.log_softmax(x)
    assert lg[0] == 0 and np.all(np.isfinite(lg[:2]) | (lg[:2] == -INF))


# ---- scipy ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_against_scipy(rng, dtype, axis):
    x = data(rng, (6, 7, 8), dtype)
    eps = np.finfo(dtype).eps
    # scipy in float64 rounds x - max (relative error up to |x - max| 2^-53 in
    # each weight) and exp: its own error is (|x - max| + 3) 2^-53 relative.
    scipy_err = (np.ptp(x) + 3) * 2.0**-53
    ref = scipy.special.softmax(x.astype(np.float64), axis=axis)
    np.testing.assert_allclose(softdot.softmax(x, axis=axis), ref, rtol=eps + scipy_err, atol=0)
    ref = scipy.special.log_softmax(x.astype(np.float64), axis=axis)
    # scipy's log_softmax has an absolute error of about the same size (it
    # takes the log of a sum near 1).
    np.testing.assert_allclose(softdot.log_softmax(x, axis=axis), ref, rtol=2 * eps, atol=scipy_err)
    # scipy on the same dtype (its own errors are then a few ulp of x).
    np.testing.assert_allclose(
        softdot.softmax(x, axis=axis),
        scipy.special.softmax(x, axis=axis),
        rtol=(np.ptp(x) + 4) * eps,
        atol=0,
    )


# ---- a strided axis: bit for bit the contiguous computation -------------------------------


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _contiguous_rows_result(f, x, axis, where=None, **kw):
    """f on a C-ordered copy with `axis` moved last (and `where` likewise),
    moved back: the rows the core sees when the axis is contiguous."""
    xm = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    wm = (
        None
        if where is None
        else np.ascontiguousarray(np.moveaxis(np.broadcast_to(where, x.shape), axis, -1))
    )
    return np.moveaxis(f(xm, where=wm, **kw), -1, axis)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((512, 300), 0),  # several blocks of 64-row tiles, ragged edges
        ((70, 1030), 0),  # more rows than one scratch block, a ragged last block
        ((600, 700), 0),  # over 2^18 elements: blocks split across OpenMP threads
        ((3, 1), 0),
        ((1, 5), 0),
        ((7, 130, 9), 1),
        ((7, 130, 9), 0),
        ((5, 3, 4, 66), 1),
    ],
)
@pytest.mark.parametrize(
    "fn,kw",
    [
        (softdot.softmax, {}),
        (softdot.softmax, {"precision": "fast", "temperature": 0.7}),
        (softdot.log_softmax, {}),
        (softdot.log_softmax, {"temperature": 2.5}),
    ],
)
def test_strided_axis_bits_equal_contiguous(rng, dtype, shape, axis, fn, kw):
    """softmax(x, axis=0) of a row-major x (a strided axis: the core transposes
    blocks of rows into a contiguous scratch) is bitwise softmax(x.T.copy()).T."""
    x = data(rng, shape, dtype)
    x.flat[::11] = -INF  # weight exactly 0 among the others
    y = fn(x, axis=axis, **kw)
    assert y.dtype == dtype and y.shape == x.shape and y.flags.c_contiguous
    ref = _contiguous_rows_result(fn, x, axis, **kw)
    assert np.array_equal(y, ref, equal_nan=True)
    assert np.array_equal(_bits(y), _bits(ref))  # the bits, zeros' signs too
    if x.ndim == 2 and axis == 0:
        assert np.array_equal(y, fn(x.T.copy(), **kw).T)


@pytest.mark.parametrize("dtype", FLOATS)
def test_strided_axis_layouts_where_and_out(rng, dtype):
    base = data(rng, (90, 2, 140), dtype)
    keep = rng.random((90, 1, 140)) < 0.8
    keep[:, :, 7] = False  # a fully excluded row along axis 0: weights +0.0
    for x in (base, base[::-1], base[:, :, ::2], np.asfortranarray(base), base.transpose(2, 1, 0)):
        w = keep if x.shape == base.shape else None
        for f in (softdot.softmax, softdot.log_softmax):
            y = f(x, axis=0, where=w)
            ref = _contiguous_rows_result(f, x, 0, where=w)
            assert np.array_equal(_bits(y), _bits(ref))
            out = np.empty_like(x)[::-1]  # a strided, reversed out
            r = f(x, axis=0, where=w, out=out)
            assert r is out and np.array_equal(_bits(out), _bits(ref))
    # in place along axis 0 of a row-major matrix
    x = data(rng, (300, 77), dtype)
    ref = softdot.softmax(x.T.copy()).T
    r = softdot.softmax(x, axis=0, out=x)
    assert r is x and np.array_equal(x, ref)
