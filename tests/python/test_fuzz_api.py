"""A hypothesis harness over the public functions (docs/fuzzing.md, "Python"):
random dtypes (float16/32/64, integers, bool, complex, object), shapes (0-d,
empty, up to 3-d), memory layouts (reversed, strided, transposed, broadcast
with stride 0, non-native byte order), axes (in and out of range) and `out`
arrays (right, wrong shape, wrong dtype, read-only, the input itself). Every
call either returns a result that matches a float64 reference or raises
ValueError or TypeError; nothing else may escape, and the process must not
crash (run under ASan once: docs/fuzzing.md). SOFTDOT_FUZZ_EXAMPLES raises
the number of examples per test (default 40)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import softdot

EXAMPLES = int(os.environ.get("SOFTDOT_FUZZ_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALLOWED = (ValueError, TypeError)

DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int32,
    np.int64,
    np.uint8,
    np.bool_,
    np.complex64,
    object,
    ">f4",
    ">f8",
]


@st.composite
def arrays(draw, max_dims=3):
    """An array of any listed dtype in one of several layouts."""
    ndim = draw(st.integers(0, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    n = int(np.prod(shape)) if shape else 1
    values = draw(st.lists(st.floats(-50, 50, width=32), min_size=n, max_size=n))
    base = np.array(values, dtype=np.float64).reshape(shape)
    if dtype.kind == "b":
        a = base > 0
    elif dtype.kind in "iu":
        a = np.clip(np.round(base), 0 if dtype.kind == "u" else -50, 50).astype(dtype)
    else:
        a = base.astype(dtype)
    layout = draw(st.sampled_from(["c", "reversed", "strided", "transposed", "broadcast"]))
    if layout == "reversed" and a.ndim:
        a = a[..., ::-1]
    elif layout == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]
    elif layout == "transposed" and a.ndim >= 2:
        a = a.T
    elif layout == "broadcast" and a.ndim and a.shape[-1] >= 1:
        a = np.broadcast_to(a[..., :1], a.shape)
    return a


def real_float(a):
    """True when softdot computes on `a` as given (float32/float64, native or
    not) or after converting integers and booleans to float64."""
    return a.dtype.kind in "fiub" and a.dtype != np.float16 and a.dtype.itemsize <= 8


def ref_softmax(x, axis, log=False):
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return (x - m - np.log(s)) if log else e / s


def check_close(got, want, dtype):
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def result_dtype(a):
    return (
        a.dtype
        if a.dtype in (np.float32, np.float64)
        else (np.dtype(np.float32) if a.dtype == np.dtype(">f4") else np.dtype(np.float64))
    )


@st.composite
def out_for(draw, x):
    """None, or an out array: right, wrong shape, wrong dtype, read-only, or x."""
    kind = draw(st.sampled_from(["none", "none", "right", "shape", "dtype", "readonly", "self"]))
    dt = result_dtype(x) if real_float(x) else np.float64
    if kind == "none":
        return None
    if kind == "right":
        return np.empty(x.shape, dtype=dt)
    if kind == "shape":
        return np.empty(x.shape + (1,), dtype=dt)
    if kind == "dtype":
        return np.empty(x.shape, dtype=np.float32 if dt == np.float64 else np.float64)
    if kind == "readonly":
        o = np.empty(x.shape, dtype=dt)
        o.flags.writeable = False
        return o
    return x


def call(f, *args, **kw):
    """f(*args, **kw), or None when it raised ValueError or TypeError."""
    try:
        return f(*args, **kw)
    except ALLOWED:
        return None


@SETTINGS
@given(st.data(), st.booleans())
def test_softmax_and_log_softmax(data, log):
    x = data.draw(arrays())
    axis = data.draw(st.integers(-4, 3))
    out = data.draw(out_for(x))
    before = x.copy()
    f = softdot.log_softmax if log else softdot.softmax
    y = call(f, x, axis=axis, out=out)
    if not (isinstance(out, np.ndarray) and out is x):
        np.testing.assert_array_equal(x, before)  # the input is never modified
    if y is None:
        return
    # What was accepted is a real float array with the axis in range.
    assert real_float(x) and x.ndim >= 1 and -x.ndim <= axis < x.ndim
    if x.size == 0:
        assert np.shape(y) == x.shape  # empty in, empty out
    else:
        check_close(y, ref_softmax(before.astype(np.float64), axis, log), result_dtype(x))
    if out is not None:
        assert y is out


@SETTINGS
@given(st.data())
def test_logsumexp(data):
    x = data.draw(arrays())
    axis = data.draw(st.sampled_from([None, -4, -1, 0, 1, 3]))
    y = call(softdot.logsumexp, x, axis=axis)
    if y is None:
        return
    assert real_float(x)
    if x.size == 0:
        # The log of an empty sum: -inf for every row that is left.
        assert np.all(np.asarray(y) == -np.inf)
        return
    xd = x.astype(np.float64)
    m = np.max(xd, axis=axis, keepdims=True)
    want = np.squeeze(m + np.log(np.sum(np.exp(xd - m), axis=axis, keepdims=True)), axis=axis)
    check_close(y, want, result_dtype(x))


@SETTINGS
@given(st.data())
def test_dot(data):
    x = data.draw(arrays(max_dims=2))
    y = data.draw(arrays(max_dims=2))
    accurate = data.draw(st.booleans())
    r = call(softdot.dot, x, y, accurate=accurate)
    if r is None:
        return
    assert real_float(x) and real_float(y)
    want = (
        np.tensordot(x.astype(np.float64), y.astype(np.float64), axes=([-1], [-1]))
        if x.ndim and y.ndim
        else x.astype(np.float64) * y.astype(np.float64)
    )
    np.testing.assert_allclose(np.asarray(r, dtype=np.float64), want, rtol=1e-5, atol=1e-3)


@st.composite
def qkv(draw):
    """Attention inputs: usually consistent 4-d shapes, sometimes not."""
    b, hkv, g = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq, lk, d, dv = (draw(st.integers(0, 5)) for _ in range(4))
    shapes = [(b, hkv * g, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)]
    if draw(st.integers(0, 3)) == 0:
        i = draw(st.integers(0, 2))
        shapes[i] = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=5)))
    dtypes = [np.float32, np.float64, np.float16, np.int32, ">f4"]
    arrs = []
    for s in shapes:
        dt = np.dtype(draw(st.sampled_from(dtypes)) if draw(st.integers(0, 4)) == 0 else np.float32)
        a = (
            np.asarray(
                draw(
                    st.lists(
                        st.floats(-3, 3, width=32),
                        min_size=int(np.prod(s)),
                        max_size=int(np.prod(s)),
                    )
                )
            )
            .reshape(s)
            .astype(dt)
        )
        if a.ndim and draw(st.booleans()):
            a = a[..., ::-1]
        arrs.append(a)
    return arrs


@SETTINGS
@given(qkv(), st.booleans(), st.sampled_from([None, 0.5]))
def test_attention(arrs, causal, scale):
    q, k, v = arrs
    r = call(softdot.scaled_dot_product_attention, q, k, v, causal=causal, scale=scale)
    if r is None:
        return
    b, h, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    qd, kd, vd = (a.astype(np.float64) for a in (q, k, v))
    sc = 1 / np.sqrt(d) if scale is None else scale
    want = np.zeros((b, h, lq, dv))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hkv)
            s = qd[bi, hi] @ kd[bi, kh].T * sc
            if causal:
                qi = np.arange(lq)[:, None] + lk - lq
                s = np.where(np.arange(lk)[None, :] <= qi, s, -np.inf)
            for i in range(lq):
                if lk == 0 or np.all(np.isneginf(s[i])):
                    continue
                w = np.exp(s[i] - s[i].max())
                want[bi, hi, i] = (w / w.sum()) @ vd[bi, kh]
    np.testing.assert_allclose(np.asarray(r, dtype=np.float64), want, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(st.data())
def test_quantize_kv(data):
    x = data.draw(arrays(max_dims=4))
    r = call(softdot.quantize_kv, x)
    if r is None:
        return
    values, scales = r
    assert x.dtype.kind == "f" and x.ndim >= 2  # [..., S, E]
    assert values.shape == x.shape and scales.shape == x.shape[:-1] + (1,)
    if x.size == 0:
        return
    deq = values.astype(np.float64) * scales.astype(np.float64)
    np.testing.assert_allclose(
        deq, x.astype(np.float64), atol=float(np.max(scales, initial=0.0)) * 0.51 + 1e-30
    )


def test_harness_sees_errors_and_results():
    """The harness's own premise: both outcomes occur."""
    assert call(softdot.softmax, np.ones(3, dtype=np.complex64)) is None
    assert call(softdot.softmax, np.ones(3, dtype=np.float32)) is not None
    with pytest.raises(ALLOWED):
        softdot.softmax(np.ones(3), axis=5)
