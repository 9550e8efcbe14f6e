"""Shared helpers for the softdot Python tests: exact (wide-precision)
references for the softmax family, dot products and attention, the error
bounds the C++ headers state, and array layouts (C, F, strided,
negative-stride) built around the same logical values.

torch, scipy, ml_dtypes, hypothesis and mpmath are required test
dependencies: they are imported here directly, so a missing one is a
collection error, never a silent skip.
"""

from __future__ import annotations

import math
from fractions import Fraction

import hypothesis  # noqa: F401  (required dependency)
import ml_dtypes  # noqa: F401  (required dependency)
import mpmath
import numpy as np
import pytest
import scipy.special  # noqa: F401  (required dependency)
import torch  # noqa: F401  (required dependency)

import softdot

FLOATS = (np.float32, np.float64)
U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53

# ---------------------------------------------------------------------------
# Wide arithmetic: np.longdouble when it has at least 64 significant bits
# (x86 extended, or IEEE quad on aarch64), else mpmath at 113 bits. Either
# way the reference is more than 10 bits more precise than float64, so a
# reference rounded to float64 is one of the two floats around the exact
# value, which is what a 1-ulp (faithful) comparison needs.
# ---------------------------------------------------------------------------

LONGDOUBLE_WIDE = np.finfo(np.longdouble).nmant >= 63

if LONGDOUBLE_WIDE:

    def to_wide(a):
        return np.asarray(a).astype(np.longdouble)

    wexp = np.exp
    wlog = np.log
    wlog1p = np.log1p

    def from_wide(a, dtype):
        return np.asarray(a).astype(dtype)

else:  # pragma: no cover - only on platforms whose long double is double
    mpmath.mp.prec = 113
    _mpf = np.vectorize(lambda v: mpmath.mpf(float(v)), otypes=[object])
    _exp = np.frompyfunc(mpmath.exp, 1, 1)
    _log = np.frompyfunc(mpmath.log, 1, 1)
    _log1p = np.frompyfunc(mpmath.log1p, 1, 1)

    def to_wide(a):
        return _mpf(np.asarray(a, dtype=np.float64))

    def wexp(a):
        return _exp(a)

    def wlog(a):
        return _log(a)

    def wlog1p(a):
        return _log1p(a)

    def _round(v, bits):
        with mpmath.workprec(bits):
            return float(+v)

    def from_wide(a, dtype):
        bits = 24 if np.dtype(dtype) == np.float32 else 53
        f = np.vectorize(lambda v: _round(v, bits), otypes=[np.float64])
        return f(a).astype(dtype)


def ulp(a) -> np.ndarray:
    """The spacing of the floats at |a| (in a's dtype)."""
    return np.spacing(np.abs(np.asarray(a)))


def assert_ulp(actual, desired, maxulp):
    """Both arrays of the same float dtype; every element within `maxulp`
    units in the last place (numpy's count of representable floats)."""
    actual = np.asarray(actual)
    desired = np.asarray(desired)
    assert actual.dtype == desired.dtype, (actual.dtype, desired.dtype)
    assert actual.shape == desired.shape, (actual.shape, desired.shape)
    np.testing.assert_array_max_ulp(actual, desired, maxulp=maxulp, dtype=actual.dtype)


# ---------------------------------------------------------------------------
# Softmax family references (finite inputs; where/-inf give weight 0).
# ---------------------------------------------------------------------------


def scaled_wide(x, temperature=1.0):
    """x / T as the library defines it: x times 1/T rounded to x's dtype,
    the product kept exact (wide)."""
    x = np.asarray(x)
    r = x.dtype.type(1.0 / temperature)
    xw = to_wide(x)
    if r != 1:
        xw = xw * to_wide(r)
    return xw


def max_and_log_sum(xw, axis):
    """(m, L) with m the max along `axis` and L = log(sum exp(x - m)) >= 0,
    computed as log1p of the sum without one max term, so that L is accurate
    to the wide precision relative to itself even when it is tiny (a
    dominant entry), where log(1 + tiny) would not be."""
    m = np.max(xw, axis=axis, keepdims=True)
    e = wexp(xw - m)
    if axis is None:
        first = np.zeros(xw.shape, dtype=bool)
        first.flat[int(np.argmax(xw))] = True
    else:
        first = np.zeros(xw.shape, dtype=bool)
        np.put_along_axis(first, np.expand_dims(np.argmax(xw, axis=axis), axis), True, axis=axis)
    rest = np.sum(np.where(first, to_wide(0.0), e), axis=axis, keepdims=True)
    return m, wlog1p(rest), e


def softmax_ref_wide(x, axis=-1, where=None, temperature=1.0, log=False):
    """Softmax (or log-softmax) in wide precision, along one axis."""
    x = np.asarray(x)
    xw = scaled_wide(x, temperature)
    if where is not None:
        keep = np.broadcast_to(np.asarray(where, dtype=bool), x.shape)
        xw = np.where(keep, xw, to_wide(-np.inf))
    m, L, e = max_and_log_sum(xw, axis)
    if log:
        return (xw - m) - L
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_ref(x, axis=-1, where=None, temperature=1.0):
    """The exact softmax rounded once to x's dtype."""
    x = np.asarray(x)
    return from_wide(softmax_ref_wide(x, axis, where, temperature), x.dtype)


def log_softmax_ref(x, axis=-1, where=None, temperature=1.0):
    x = np.asarray(x)
    return from_wide(softmax_ref_wide(x, axis, where, temperature, log=True), x.dtype)


def log_softmax_allowance(ref_wide, dtype):
    """log_softmax's stated bound (docs/accuracy.md, the table of bounds):
    1 ulp where |y| >= 1, and 2^-23 (float32) / 2^-52 (float64) absolute below
    (the exact error of x_i - m is kept, but L is a rounded log of a rounded
    sum, and with a temperature the low part of x * (1/T) enters the shift and
    not the sum)."""
    dtype = np.dtype(dtype)
    small = 2.0**-23 if dtype == np.float32 else 2.0**-52
    big = to_wide(ulp(from_wide(ref_wide, dtype)))
    return np.where(np.abs(ref_wide) >= 1, big, small)


def assert_log_softmax_bound(y, x, axis=-1, where=None, temperature=1.0):
    """log_softmax's stated bound on the kept entries, -inf elsewhere."""
    x = np.asarray(x)
    ref = softmax_ref_wide(x, axis, where, temperature, log=True)
    if where is not None:
        keep = np.broadcast_to(np.asarray(where, dtype=bool), x.shape)
        assert np.all(y[~keep] == -np.inf)
    else:
        keep = np.ones(x.shape, dtype=bool)
    with np.errstate(invalid="ignore"):  # -inf - -inf on excluded entries
        err = np.where(keep, np.abs(to_wide(y) - ref), 0)
        lim = log_softmax_allowance(np.where(keep, ref, 0), x.dtype)
    bad = err > lim
    assert not bad.any(), (
        f"{bad.sum()} log-weights beyond the stated bound; worst "
        f"{float(np.max(err / lim)):.3g} x the allowance, at {np.argwhere(bad)[:3].tolist()}"
    )


def logsumexp_ref_wide(x, axis=None, where=None, temperature=1.0, keepdims=False):
    x = np.asarray(x)
    xw = scaled_wide(x, temperature)
    if where is not None:
        keep = np.broadcast_to(np.asarray(where, dtype=bool), x.shape)
        xw = np.where(keep, xw, to_wide(-np.inf))
    if isinstance(axis, tuple):  # reduced axes last, merged into one
        rest = [i for i in range(x.ndim) if i not in [a % x.ndim for a in axis]]
        order = rest + [a % x.ndim for a in axis]
        xr = np.transpose(xw, order).reshape([x.shape[i] for i in rest] + [-1])
        m, L, _ = max_and_log_sum(xr, -1)
        r = (m + L)[..., 0]
        if keepdims:
            r = r.reshape([1 if i in order[len(rest) :] else x.shape[i] for i in range(x.ndim)])
        return r
    m, L, _ = max_and_log_sum(xw, axis)
    r = m + L
    if not keepdims:
        r = np.squeeze(r, axis=axis) if axis is not None else r.reshape(())
    return r


def logsumexp_ref(x, **kw):
    return from_wide(logsumexp_ref_wide(x, **kw), np.asarray(x).dtype)


def logsumexp_mp(row) -> mpmath.mpf:
    """logsumexp of a 1-d float row with mpmath at 200 bits (for rows whose
    result cancels, where even long double is not enough)."""
    with mpmath.workprec(200):
        vals = [mpmath.mpf(float(v)) for v in row]
        m = max(vals)
        return m + mpmath.log(mpmath.fsum(mpmath.exp(v - m) for v in vals))


def frac_array(a) -> np.ndarray:
    """An object array of exact Fractions with a's values."""
    a = np.asarray(a, dtype=np.float64)
    return np.array([Fraction(float(v)) for v in a.ravel()], dtype=object).reshape(a.shape)


def softmax_backward_exact(y, dy):
    """dx_i = y_i (dy_i - <dy, y>) exactly, along the last axis, as Fractions,
    together with s = <dy, y> (exact) per row."""
    yf, df = frac_array(y), frac_array(dy)
    s = np.sum(yf * df, axis=-1, keepdims=True)
    return yf * (df - s), s


def dot_exact(x, y) -> Fraction:
    return sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, y)), Fraction(0))


def gamma(n, u):
    return n * u / (1 - n * u)


# ---------------------------------------------------------------------------
# Attention reference in float64 and the header's error bound.
# ---------------------------------------------------------------------------


def to_f64(a):
    """float64 copy of a numpy or torch array of any float dtype (float16,
    bfloat16 included: the widening is exact)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).numpy()
    a = np.asarray(a)
    return a.astype(np.float64)


def visibility(L, S, *, causal=False, window=(-1, -1), kv_range=None):
    """[L, S] booleans: key j visible to query i (bottom-right alignment:
    p(i) = i + S - L)."""
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    p = i + S - L
    vis = np.ones((L, S), dtype=bool)
    wl, wr = window
    if causal:
        vis &= j <= p
    if wl >= 0:
        vis &= j >= p - wl
    if wr >= 0:
        vis &= j <= p + wr
    if kv_range is not None:
        b, e = kv_range
        e = S if e is None else min(e, S)
        vis &= (j >= b) & (j < e)
    return vis


def attention_ref(
    q,
    k,
    v,
    attn_mask=None,
    *,
    bias=None,
    scale=None,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    sinks=None,
    kv_range=None,
):
    """The exact attention of these (float32 / 16-bit) inputs, computed in
    float64, with the bound the header states:

        |O - exact| <= (2 D + 70 u) W + u |exact| + 2^-149 (S + 1 + sum_j |V_j|)

    Returns (out, lse, bound, D, weights), all float64, shapes as torch's
    ([..., L, Ev], [..., L], [..., L, Ev], [..., L], [..., L, S])."""
    q, k = to_f64(q), to_f64(k)
    v = None if v is None else to_f64(v)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        if v is not None:
            v = np.repeat(v, g, axis=-3)
    sc = float(np.float32(1.0 / math.sqrt(E) if scale is None else scale))
    kt = np.swapaxes(k, -1, -2)
    s1 = sc * (q @ kt)  # exact scaled scores s'
    dotabs = np.abs(q) @ np.abs(kt)
    s = softcap * np.tanh(s1 / softcap) if softcap else s1
    vis = np.broadcast_to(
        visibility(L, S, causal=causal, window=window, kv_range=kv_range), s.shape
    )
    if attn_mask is not None:
        m = to_f64(attn_mask) if np.asarray(attn_mask).dtype != bool else None
        if m is None:
            vis = vis & np.broadcast_to(np.asarray(attn_mask), s.shape)
        else:
            s = s + m
    if bias is not None:
        s = s + to_f64(bias)
    s = np.where(vis, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        sk = to_f64(sinks).reshape((-1, 1, 1))
        mx = np.maximum(mx, sk)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    den = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sk - mx)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    with np.errstate(divide="ignore"):
        lse = (mx + np.log(den))[..., 0]
    u = U32
    Dm = sc * gamma(E, u) * dotabs + 2 * u * (np.abs(s1) + np.abs(np.where(np.isfinite(s), s, 0)))
    if softcap:
        Dm = Dm + 4 * u * softcap
    D = np.where(vis, Dm, 0.0).max(axis=-1, keepdims=True)
    if v is None:
        return None, lse, None, D[..., 0], w
    out = w @ v
    W = w @ np.abs(v)
    bound = (
        (2 * D + 70 * u) * W
        + u * np.abs(out)
        + 2.0**-149 * (S + 1 + np.abs(v).sum(axis=-2, keepdims=True))
    )
    return out, lse, bound, D[..., 0], w


def assert_attention_bound(out, ref, bound):
    out = to_f64(out)
    err = np.abs(out - ref)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{bad.sum()} elements outside the stated bound; worst err/bound "
        f"{np.max(err / bound)}, max err {err.max()}"
    )


# ---------------------------------------------------------------------------
# Layouts: the same logical values in different memory layouts.
# ---------------------------------------------------------------------------

LAYOUTS_1D = ("C", "step", "neg")
LAYOUTS = ("C", "F", "step_last", "step_first", "neg_first", "neg_last")


def make_layout(values: np.ndarray, layout: str) -> np.ndarray:
    """A view with exactly `values` (logical shape and contents) laid out as
    `layout`; the view never owns a contiguous C copy unless layout is 'C'."""
    v = np.asarray(values)
    if layout == "C":
        return np.ascontiguousarray(v).copy()
    if layout == "F":
        r = np.asfortranarray(v).copy(order="F")
        assert not r.flags.c_contiguous or v.ndim == 1
        return r
    if layout in ("step", "step_last"):
        big = np.zeros(v.shape[:-1] + (2 * v.shape[-1],), dtype=v.dtype)
        big[..., ::2] = v
        r = big[..., ::2]
    elif layout == "step_first":
        big = np.zeros((2 * v.shape[0],) + v.shape[1:], dtype=v.dtype)
        big[::2] = v
        r = big[::2]
    elif layout == "neg" or layout == "neg_last":
        r = np.ascontiguousarray(v[..., ::-1])[..., ::-1]
    elif layout == "neg_first":
        r = np.ascontiguousarray(v[::-1])[::-1]
    else:
        raise AssertionError(layout)
    assert np.array_equal(r, v, equal_nan=True)
    return r


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name, so every test is reproducible
    on its own."""
    seed = sum(request.node.nodeid.encode()) * 7919 + len(request.node.nodeid)
    return np.random.default_rng(seed)


@pytest.fixture
def restore_simd():
    """Yields, then always restores the automatic SIMD choice."""
    try:
        yield
    finally:
        softdot.force_simd_target("")
