"""Zero copy and in-place use: out= is returned as is (numpy: the same
object; torch: the same storage, data_ptr unchanged), out=x in place for
softmax, log_softmax, softmax_backward and softmax_apply, F-ordered,
strided-batch, negative-stride and broadcast inputs read where they lie
(no temporary copy, measured with tracemalloc, which sees numpy's
allocations) and with correct results, and inputs never modified."""

import tracemalloc

import numpy as np
import pytest
import torch

import softdot

from conftest import FLOATS, assert_attention_bound, assert_ulp, attention_ref, softmax_ref

# A call that copies its (>= 1 MB) input allocates at least that much; a
# zero-copy call allocates a few hundred bytes of Python objects.
NO_COPY_LIMIT = 64 * 1024


def peak_bytes(fn):
    """Peak bytes allocated (as tracemalloc sees them: Python objects and
    numpy buffers) while fn runs, after one warm-up call."""
    fn()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def big(rng, shape, dtype=np.float64):
    return (rng.standard_normal(shape) * 3).astype(dtype)


# ---- out= ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_numpy_out_is_returned(rng, dtype):
    x = big(rng, (6, 9), dtype)
    for fn, kw in (
        (softdot.softmax, {}),
        (softdot.softmax, {"axis": 0}),
        (softdot.softmax, {"precision": "fast"}),
        (softdot.log_softmax, {}),
        (softdot.log_softmax, {"axis": 0, "temperature": 2.0}),
        (softdot.softmax, {"where": x > -1}),
    ):
        out = np.full_like(x, 7.0)
        r = fn(x, out=out, **kw)
        assert r is out
        np.testing.assert_array_equal(out, fn(x, **kw))
    y = softdot.softmax(x)
    out = np.empty_like(x)
    assert softdot.softmax_backward(y, x, out=out) is out
    np.testing.assert_array_equal(out, softdot.softmax_backward(y, x))
    lo = np.empty(6, dtype=dtype)
    assert softdot.logsumexp(x, axis=1, out=lo) is lo
    # An F-ordered out and a strided out (every other column of a buffer).
    outf = np.empty_like(x, order="F")
    assert softdot.softmax(x, out=outf) is outf
    np.testing.assert_array_equal(outf, y)
    buf = np.zeros((6, 18), dtype=dtype)
    r = softdot.softmax(x, out=buf[:, ::2])
    assert np.shares_memory(r, buf)
    np.testing.assert_array_equal(buf[:, ::2], y)
    assert np.all(buf[:, 1::2] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_out_keeps_its_storage(rng, dtype):
    x = torch.from_numpy(rng.standard_normal((5, 8))).to(dtype)
    for fn, kw in (
        (softdot.softmax, {}),
        (softdot.softmax, {"axis": 0}),
        (softdot.log_softmax, {}),
        (softdot.log_softmax, {"axis": 0}),
        (softdot.softmax, {"where": x > 0}),
    ):
        out = torch.full_like(x, 3.0)
        ptr = out.data_ptr()
        r = fn(x, out=out, **kw)
        assert r is out and out.data_ptr() == ptr
        torch.testing.assert_close(out, fn(x, **kw), rtol=0, atol=0)
    # A transposed (non-contiguous) out tensor.
    base = torch.empty(8, 5, dtype=dtype)
    r = softdot.softmax(x, out=base.t())
    assert r.data_ptr() == base.data_ptr()
    torch.testing.assert_close(base.t(), softdot.softmax(x), rtol=0, atol=0)
    lo = torch.empty(5, dtype=dtype)
    ptr = lo.data_ptr()
    r = softdot.logsumexp(x, axis=1, out=lo)
    assert r is lo and lo.data_ptr() == ptr
    y = softdot.softmax(x)
    g = torch.empty_like(x)
    ptr = g.data_ptr()
    assert softdot.softmax_backward(y, x, out=g) is g and g.data_ptr() == ptr
    # Results for torch inputs are torch tensors owning fresh memory.
    r = softdot.softmax(x)
    assert isinstance(r, torch.Tensor) and r.data_ptr() != x.data_ptr()


def test_attention_out_storage(rng):
    q = torch.from_numpy(rng.standard_normal((1, 2, 6, 8)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((1, 2, 9, 8)).astype(np.float32))
    out = torch.empty(1, 2, 6, 8)
    ptr = out.data_ptr()
    r = softdot.scaled_dot_product_attention(q, k, k, out=out)
    assert r is out and out.data_ptr() == ptr
    torch.testing.assert_close(out, softdot.scaled_dot_product_attention(q, k, k), rtol=0, atol=0)
    w = torch.empty(1, 2, 6, 9)
    assert softdot.attention_weights(q, k, out=w) is w
    oa = out.clone()
    lse = torch.zeros(1, 2, 6)
    r, _ = softdot.attention_merge(oa, lse, out, lse, out=oa)
    assert r is oa


# ---- in place ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 0])
def test_in_place(rng, dtype, axis):
    x0 = big(rng, (7, 12), dtype)
    for fn in (softdot.softmax, softdot.log_softmax):
        x = x0.copy()
        expect = fn(x0, axis=axis)
        r = fn(x, axis=axis, out=x)
        assert r is x
        np.testing.assert_array_equal(x, expect)
    y0 = softdot.softmax(x0, axis=axis)
    dy0 = big(rng, (7, 12), dtype)
    expect = softdot.softmax_backward(y0, dy0, axis=axis)
    y, dy = y0.copy(), dy0.copy()
    assert softdot.softmax_backward(y, dy, axis=axis, out=y) is y
    np.testing.assert_array_equal(y, expect)
    np.testing.assert_array_equal(dy, dy0)
    y, dy = y0.copy(), dy0.copy()
    assert softdot.softmax_backward(y, dy, axis=axis, out=dy) is dy
    np.testing.assert_array_equal(dy, expect)
    np.testing.assert_array_equal(y, y0)


def test_in_place_views_and_torch(rng):
    # In place on a strided view: only the view's elements change.
    buf = big(rng, (8, 10))
    keep = buf.copy()
    v = buf[::2, 1:9]
    expect = softdot.softmax(v.copy())
    assert softdot.softmax(v, out=v) is v
    np.testing.assert_array_equal(buf[::2, 1:9], expect)
    np.testing.assert_array_equal(buf[1::2], keep[1::2])
    np.testing.assert_array_equal(buf[:, [0, 9]], keep[:, [0, 9]])
    # Torch in place keeps the storage.
    t = torch.from_numpy(big(rng, (4, 6)))
    expect = softdot.log_softmax(t.clone())
    ptr = t.data_ptr()
    assert softdot.log_softmax(t, out=t) is t and t.data_ptr() == ptr
    torch.testing.assert_close(t, expect, rtol=0, atol=0)
    # softmax_apply in place.
    c = big(rng, (20,))
    s = softdot.softmax_state(c)
    expect = softdot.softmax(c)
    assert softdot.softmax_apply(c, s, out=c) is c
    assert_ulp(c, expect, 1)


# ---- layouts read where they lie ----------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_f_order_axis0_no_copy(rng, dtype):
    x = np.asfortranarray(big(rng, (300, 500), dtype))
    xc = x.copy(order="K")
    out = np.empty_like(x, order="F")
    peak = peak_bytes(lambda: softdot.softmax(x, axis=0, out=out))
    assert peak < NO_COPY_LIMIT, peak
    assert_ulp(out, softmax_ref(np.ascontiguousarray(x), axis=0), 1)
    peak = peak_bytes(lambda: softdot.log_softmax(x, axis=0, out=out))
    assert peak < NO_COPY_LIMIT, peak
    lo = np.empty(500, dtype=dtype)
    peak = peak_bytes(lambda: softdot.logsumexp(x, axis=0, out=lo))
    assert peak < NO_COPY_LIMIT, peak
    np.testing.assert_array_equal(x, xc)


@pytest.mark.parametrize("dtype", FLOATS)
def test_strided_and_reversed_batch_no_copy(rng, dtype):
    c = big(rng, (600, 400), dtype)
    cc = c.copy()
    out = np.empty((300, 400), dtype=dtype)
    peak = peak_bytes(lambda: softdot.softmax(c[::2], out=out))
    assert peak < NO_COPY_LIMIT, peak
    assert_ulp(out, softmax_ref(c[::2]), 1)
    out2 = np.empty_like(c)
    peak = peak_bytes(lambda: softdot.softmax(c[::-1], out=out2))
    assert peak < NO_COPY_LIMIT, peak
    assert_ulp(out2, softmax_ref(c[::-1]), 1)
    peak = peak_bytes(lambda: softdot.log_softmax(c[::-3], out=out2[:200]))
    assert peak < NO_COPY_LIMIT, peak
    # A broadcast (stride-0) where mask costs nothing either.
    w = np.ones(400, dtype=bool)
    w[::7] = False
    peak = peak_bytes(lambda: softdot.softmax(c[::2], where=w, out=out))
    assert peak < NO_COPY_LIMIT, peak
    assert_ulp(out, softmax_ref(c[::2], where=w), 1)
    np.testing.assert_array_equal(c, cc)


def test_backward_f_order_no_copy(rng):
    y = np.asfortranarray(softdot.softmax(big(rng, (400, 300)), axis=0))
    dy = np.asfortranarray(big(rng, (400, 300)))
    out = np.empty_like(y, order="F")
    peak = peak_bytes(lambda: softdot.softmax_backward(y, dy, axis=0, out=out))
    assert peak < NO_COPY_LIMIT, peak
    np.testing.assert_array_equal(
        out, softdot.softmax_backward(np.ascontiguousarray(y), np.ascontiguousarray(dy), axis=0)
    )


def test_attention_strided_no_copy(rng):
    B, L, H, E, S = 2, 64, 4, 64, 256
    qb = rng.standard_normal((B, L, H, E)).astype(np.float32)
    kb = rng.standard_normal((B, S, H, E)).astype(np.float32)
    vb = rng.standard_normal((B, S, H, E)).astype(np.float32)
    q, k, v = (np.swapaxes(a, 1, 2) for a in (qb, kb, vb))  # [B, H, L, E] views
    mask = np.tril(np.ones((L, S), dtype=bool), k=S - L)
    out = np.empty((B, H, L, E), dtype=np.float32)
    peak = peak_bytes(lambda: softdot.scaled_dot_product_attention(q, k, v, mask, out=out))
    assert peak < NO_COPY_LIMIT, peak
    ref, _, bound, _, _ = attention_ref(q, k, v, causal=True)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_array_equal(
        out,
        softdot.scaled_dot_product_attention(
            np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), causal=True
        ),
    )


def test_inputs_never_modified(rng):
    x = big(rng, (5, 7))
    xs = [x, np.asfortranarray(x), x[::-1], x[:, ::2]]
    copies = [a.copy() for a in xs]
    for a in xs:
        for axis in (0, -1):
            softdot.softmax(a, axis=axis)
            softdot.log_softmax(a, axis=axis, temperature=0.3)
            softdot.softmax(a, axis=axis, precision="fast", where=a > 0)
            softdot.softmax_backward(softdot.softmax(a, axis=axis), a, axis=axis)
        softdot.logsumexp(a, axis=(0, 1))
    for a, c in zip(xs, copies):
        np.testing.assert_array_equal(a, c)
    t = torch.from_numpy(x.copy())
    tc = t.clone()
    softdot.softmax(t.t(), axis=0)
    softdot.log_softmax(t)
    assert torch.equal(t, tc)
