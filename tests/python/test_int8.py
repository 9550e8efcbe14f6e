"""int8 keys and values: quantize_kv against a numpy reimplementation of the
rule in include/softdot/attention.h (scale = max|x| / 127 rounded to float32,
values = x / scale rounded to float32 then to the nearest integer, ties away
from zero), its error bound, zero rows, inf and NaN; attention and
attention_weights on (values, scales) pairs equal, bit for bit, the float32
calls on the dequantised values (scale * value rounded once to float32), for
numpy and torch, with GQA and every option, and are close to torch's
scaled_dot_product_attention (enable_gqa) and within the stated bound of the
float64 reference on the dequantised values; the errors for dtypes, shapes
and bad scales; no copies of inputs the core can read in place."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_zero_copy import NO_COPY_LIMIT, peak_bytes

import softdot

from conftest import assert_attention_bound, attention_ref

sdpa = softdot.scaled_dot_product_attention
RTOL, ATOL = 1e-5, 1e-6  # as test_attention.py: unit-scale data against torch


# ---- the reference -------------------------------------------------------------------


def quantize_ref(x):
    """The rule of attention.h in numpy: float32 arithmetic, each operation
    rounded once (numpy's float32 division is IEEE's), the rounding to an
    integer in float64 where x / scale is exact."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = amax / np.float32(127)
    assert scale.dtype == np.float32
    # Below 2^-126: the smallest float32 with 127 * scale >= max|x|.
    tiny = np.finfo(np.float32).tiny
    up = (scale < tiny) & (scale.astype(np.float64) * 127 < amax.astype(np.float64))
    scale = np.where(up, np.nextafter(scale, np.float32(np.inf)), scale).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    t = (x / safe).astype(np.float64)  # float32 quotient, exact in float64
    r = np.sign(t) * np.floor(np.abs(t) + 0.5)  # to nearest, ties away from zero
    r = np.where(scale > 0, np.clip(r, -127, 127), 0)
    return r.astype(np.int8), scale


def dequantize(values, scales):
    """scale * value rounded once to float32 (numpy or torch)."""
    if isinstance(values, torch.Tensor):
        return values.to(torch.float32) * scales
    return values.astype(np.float32) * scales


def bits(a):
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    assert a.dtype == np.float32
    return np.ascontiguousarray(a).view(np.uint32)


def assert_same_bits(a, b):
    np.testing.assert_array_equal(bits(a), bits(b))


def int8_qkv(rng, B, H, Hk, L, S, E, Ev=None, lib="numpy"):
    """q, the int8 pairs of k and v, and their dequantised float32 copies."""
    Ev = E if Ev is None else Ev
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = (rng.standard_normal((B, Hk, S, E)) * rng.uniform(0.1, 3, (B, Hk, S, 1))).astype(np.float32)
    v = rng.standard_normal((B, Hk, S, Ev)).astype(np.float32)
    if lib == "torch":
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
    kp, vp = softdot.quantize_kv(k), softdot.quantize_kv(v)
    return q, kp, vp, dequantize(*kp), dequantize(*vp)


# ---- quantize_kv ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 16), (3, 9, 5), (2, 3, 33, 64), (2, 2, 2, 5, 8)])
@pytest.mark.parametrize("magnitude", [1.0, 1e-3, 1e30, 1e-40])
def test_quantize_matches_the_rule(rng, shape, magnitude):
    x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    x.reshape(-1, shape[-1])[::3] *= np.float32(7.5)  # rows of several magnitudes
    xc = x.copy()
    values, scales = softdot.quantize_kv(x)
    assert values.dtype == np.int8 and values.shape == shape
    assert scales.dtype == np.float32 and scales.shape == shape[:-1] + (1,)
    rv, rs = quantize_ref(x)
    np.testing.assert_array_equal(bits(scales), bits(rs))
    np.testing.assert_array_equal(values, rv)
    np.testing.assert_array_equal(x, xc)
    # The largest magnitude of each row maps to +-127 exactly (normal scales;
    # a subnormal scale was rounded up, so its largest value may be less).
    normal = scales[..., 0] >= np.finfo(np.float32).tiny
    assert np.all(np.max(np.abs(values.astype(int)), axis=-1)[normal] == 127)


def test_quantize_ties_go_away_from_zero():
    # scale = 127 / 127 = 1, so each x / scale is x itself: halves are ties.
    x = np.array([[127, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 3.4999998]], np.float32)
    values, scales = softdot.quantize_kv(x)
    assert scales[0, 0] == 1
    np.testing.assert_array_equal(values, [[127, 3, -3, 1, -1, 2, -127, 3]])
    np.testing.assert_array_equal(values, quantize_ref(x)[0])
    # numpy's own round (half to even) would differ: the test can tell.
    assert not np.array_equal(np.round(x).astype(np.int8), values)


def test_quantize_error_bound(rng):
    """|scale * value - x| <= (0.5 + 2^-15) scale (attention.h), exactly in
    float64, over rows of very different magnitudes. The scales stay normal
    floats here: the bound's derivation takes the scale's rounding as
    relative (|d| <= 2^-24), which a subnormal scale (max|x| < 127 * 2^-126)
    does not have (test_quantize_error_bound_subnormal has those)."""
    x = rng.standard_normal((4, 3, 200, 48)) * np.exp(rng.uniform(-75, 85, (4, 3, 200, 1)))
    x = x.astype(np.float32)
    values, scales = softdot.quantize_kv(x)
    assert np.all(scales >= np.finfo(np.float32).tiny)
    assert np.min(scales) < 1e-30 and np.max(scales) > 1e30
    err = np.abs(values.astype(np.float64) * scales.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= (0.5 + 2.0**-15) * scales.astype(np.float64))
    assert np.all(np.abs(values.astype(int)) <= 127)
    # The bound is not loose by a factor: some element comes near half a step.
    assert np.max(err / np.where(scales > 0, scales, 1)) > 0.49


def test_quantize_error_bound_subnormal(rng):
    """The same bound for rows whose scale is subnormal or would round to 0
    (max|x| < 127 * 2^-126): the scale is rounded up there."""
    x = rng.standard_normal((2, 300, 16)) * np.exp(rng.uniform(-99, -87, (2, 300, 1)))
    x = x.astype(np.float32)
    x[0, 0] = 0
    x[0, 0, :2] = [3 * 2.0**-149, 2.0**-149]  # 3/127 of 2^-149 rounded to 0 before
    values, scales = softdot.quantize_kv(x)
    rv, rs = quantize_ref(x)
    np.testing.assert_array_equal(bits(scales), bits(rs))
    np.testing.assert_array_equal(values, rv)
    assert scales[0, 0, 0] == np.float32(2.0**-149)
    np.testing.assert_array_equal(values[0, 0, :2], [3, 1])
    assert np.all(scales > 0) and np.min(scales) < np.finfo(np.float32).tiny
    s64 = scales.astype(np.float64)
    err = np.abs(values.astype(np.float64) * s64 - x.astype(np.float64))
    assert np.all(err <= (0.5 + 2.0**-15) * s64)


def test_quantize_zero_rows():
    x = np.zeros((2, 3, 4), np.float32)
    x[0, 1] = [0.0, -0.0, 0.0, -0.0]
    x[1, 2] = [1.0, 0.0, -2.0, 127.0]
    values, scales = softdot.quantize_kv(x)
    zero = np.ones((2, 3), bool)
    zero[1, 2] = False
    assert np.all(scales[zero] == 0) and np.all(values[zero] == 0)
    assert not np.signbit(scales[zero]).any()
    np.testing.assert_array_equal(values[1, 2], [1, 0, -2, 127])
    assert scales[1, 2, 0] == 1
    # Attention on a zero row reads zeros.
    q = np.ones((3, 4), np.float32)
    w = softdot.attention_weights(q[None], (values[:1], scales[:1]))
    np.testing.assert_array_equal(
        w, softdot.attention_weights(q[None], np.zeros((1, 3, 4), np.float32))
    )


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_quantize_refuses_inf_and_nan(bad):
    x = np.ones((2, 3, 5, 4), np.float32)
    x[1, 2, 3, 1] = bad
    x[1, 2, 4, 0] = np.nan  # a later one is not the one named
    values = np.full(x.shape, 9, np.int8)
    scales = np.full(x.shape[:-1] + (1,), 9, np.float32)
    with pytest.raises(
        ValueError,
        match=r"quantize_kv: x \(2, 3, 5, 4\) holds "
        + {np.inf: "inf", -np.inf: "-inf"}.get(bad, "nan")
        + r" at \[1, 2, 3, 1\]: only finite values",
    ):
        softdot.quantize_kv(x, out=(values, scales))
    assert np.all(values == 9) and np.all(scales == 9)  # nothing written
    t = torch.from_numpy(x[0, 0]).clone()
    t[4, 2] = bad
    with pytest.raises(ValueError, match=r"at \[4, 2\]"):
        softdot.quantize_kv(t)


def test_quantize_torch(rng):
    x = torch.from_numpy(rng.standard_normal((2, 4, 30, 16)).astype(np.float32))
    values, scales = softdot.quantize_kv(x)
    assert isinstance(values, torch.Tensor) and values.dtype == torch.int8
    assert isinstance(scales, torch.Tensor) and scales.dtype == torch.float32
    assert values.shape == x.shape and scales.shape == (2, 4, 30, 1)
    rv, rs = quantize_ref(x.numpy())
    np.testing.assert_array_equal(values.numpy(), rv)
    np.testing.assert_array_equal(bits(scales), bits(rs))
    # A transposed ([B, S, H, E] -> [B, H, S, E]) tensor: the same bits.
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    v2, s2 = softdot.quantize_kv(xt)
    assert torch.equal(v2, values) and torch.equal(s2, scales)


def test_quantize_out(rng):
    x = rng.standard_normal((3, 10, 8)).astype(np.float32)
    rv, rs = quantize_ref(x)
    values = np.empty((3, 10, 8), np.int8)
    scales = np.empty((3, 10, 1), np.float32)
    r = softdot.quantize_kv(x, out=(values, scales))
    assert r[0] is values and r[1] is scales
    np.testing.assert_array_equal(values, rv)
    np.testing.assert_array_equal(scales, rs)
    # Strided outs: every other element of the rows (written through a
    # temporary) and scales inside a wider buffer (in place).
    vbuf = np.zeros((3, 10, 16), np.int8)
    sbuf = np.zeros((3, 10, 3), np.float32)
    r = softdot.quantize_kv(x, out=(vbuf[..., ::2], sbuf[..., 1:2]))
    np.testing.assert_array_equal(vbuf[..., ::2], rv)
    assert np.all(vbuf[..., 1::2] == 0)
    np.testing.assert_array_equal(sbuf[..., 1:2], rs)
    assert np.all(sbuf[..., [0, 2]] == 0)
    assert np.shares_memory(r[1], sbuf)
    # torch out keeps its storage.
    xt = torch.from_numpy(x)
    vt, st = torch.empty(3, 10, 8, dtype=torch.int8), torch.empty(3, 10, 1)
    ptrs = vt.data_ptr(), st.data_ptr()
    r = softdot.quantize_kv(xt, out=(vt, st))
    assert r[0] is vt and r[1] is st and (vt.data_ptr(), st.data_ptr()) == ptrs
    np.testing.assert_array_equal(vt.numpy(), rv)


def test_big_endian_float32_is_float32(rng):
    """A big-endian float32 x or scales array (a .npy written elsewhere) is
    float32: the same values, the same result."""
    x = rng.standard_normal((4, 6)).astype(np.float32)
    v, s = softdot.quantize_kv(x)
    vb, sb = softdot.quantize_kv(x.astype(">f4"))
    np.testing.assert_array_equal(vb, v)
    np.testing.assert_array_equal(bits(sb), bits(s))
    q = rng.standard_normal((2, 6)).astype(np.float32)
    assert_same_bits(sdpa(q, (v, s.astype(">f4")), (v, s)), sdpa(q, (v, s), (v, s)))


def test_quantize_empty():
    v, s = softdot.quantize_kv(np.ones((0, 4), np.float32))
    assert v.shape == (0, 4) and s.shape == (0, 1)
    v, s = softdot.quantize_kv(np.ones((2, 3, 0), np.float32))
    assert v.shape == (2, 3, 0) and s.shape == (2, 3, 1) and np.all(s == 0)


def test_quantize_no_copy(rng):
    """A 4 MB input read where it lies: C order, and the transposed view of
    [B, S, H, E] storage; outs given."""
    x = rng.standard_normal((2, 1024, 8, 64)).astype(np.float32)
    views = (np.ascontiguousarray(np.swapaxes(x, 1, 2)), np.swapaxes(x, 1, 2))
    for xv in views:
        values = np.empty(xv.shape, np.int8)
        scales = np.empty(xv.shape[:-1] + (1,), np.float32)
        peak = peak_bytes(lambda xv=xv, o=(values, scales): softdot.quantize_kv(xv, out=o))
        assert peak < NO_COPY_LIMIT, peak
        rv, rs = quantize_ref(xv)
        np.testing.assert_array_equal(values, rv)
        np.testing.assert_array_equal(scales, rs)


QUANTIZE_ERRORS = [
    (
        "float64 x",
        lambda: softdot.quantize_kv(np.ones((2, 3))),
        TypeError,
        r"quantize_kv: x has dtype float64; accepted: float32",
    ),
    (
        "torch float16 x",
        lambda: softdot.quantize_kv(torch.ones(2, 3, dtype=torch.float16)),
        TypeError,
        r"x has dtype float16; accepted: float32",
    ),
    (
        "1-d x",
        lambda: softdot.quantize_kv(np.ones(3, np.float32)),
        ValueError,
        r"x has shape \(3,\); expected \[\.\.\., S, E\]",
    ),
    (
        "out not a pair",
        lambda: softdot.quantize_kv(np.ones((2, 3), np.float32), out=np.empty((2, 3), np.int8)),
        TypeError,
        r"out must be a tuple \(values, scales\)",
    ),
    (
        "out values dtype",
        lambda: softdot.quantize_kv(
            np.ones((2, 3), np.float32),
            out=(np.empty((2, 3), np.uint8), np.empty((2, 1), np.float32)),
        ),
        TypeError,
        r"out values has dtype uint8; expected int8",
    ),
    (
        "out scales shape",
        lambda: softdot.quantize_kv(
            np.ones((2, 3), np.float32), out=(np.empty((2, 3), np.int8), np.empty(2, np.float32))
        ),
        ValueError,
        r"out scales has shape \(2,\); expected \(2, 1\)",
    ),
    (
        "out torch for numpy",
        lambda: softdot.quantize_kv(
            np.ones((2, 3), np.float32),
            out=(torch.empty(2, 3, dtype=torch.int8), torch.empty(2, 1)),
        ),
        TypeError,
        r"out values must be a numpy.ndarray",
    ),
    (
        "out values overlap x",
        lambda: (
            lambda x: softdot.quantize_kv(
                x, out=(x.view(np.int8)[:, :3], np.empty((2, 1), np.float32))
            )
        )(np.ones((2, 3), np.float32)),
        ValueError,
        r"out overlaps x",
    ),
]


@pytest.mark.parametrize(
    "name,call,exc,match", QUANTIZE_ERRORS, ids=[e[0] for e in QUANTIZE_ERRORS]
)
def test_quantize_errors(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---- attention on int8 K/V -----------------------------------------------------------


@pytest.mark.parametrize(
    "B,H,Hk,L,S,E,Ev",
    [
        (1, 1, 1, 1, 1, 4, 4),
        (1, 2, 2, 37, 129, 32, 32),  # prefill form
        (2, 4, 2, 40, 150, 64, 24),  # GQA, Ev != E
        (1, 8, 1, 3, 700, 16, 16),  # decode form, multi-query, > 512 keys
        (2, 6, 3, 1, 65, 128, 8),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_int8_is_float_on_the_dequantised_values(rng, B, H, Hk, L, S, E, Ev, causal):
    q, kp, vp, kd, vd = int8_qkv(rng, B, H, Hk, L, S, E, Ev)
    copies = [a.copy() for a in (q, *kp, *vp)]
    out, lse = sdpa(q, kp, vp, causal=causal, return_lse=True)
    assert out.shape == (B, H, L, Ev) and out.dtype == np.float32
    ref_out, ref_lse = sdpa(q, kd, vd, causal=causal, return_lse=True)
    assert_same_bits(out, ref_out)
    assert_same_bits(lse, ref_lse)
    ref, _, bound, _, _ = attention_ref(q, kd, vd, causal=causal)
    assert_attention_bound(out, ref, bound)
    w = softdot.attention_weights(q, kp, causal=causal)
    assert_same_bits(w, softdot.attention_weights(q, kd, causal=causal))
    for a, c in zip((q, *kp, *vp), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("H,Hk", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("L", [1, 24])
def test_torch_int8_against_sdpa(rng, H, Hk, L):
    q, kp, vp, kd, vd = int8_qkv(rng, 2, H, Hk, L, 70, 32, lib="torch")
    out = sdpa(q, kp, vp)
    assert isinstance(out, torch.Tensor) and out.shape == (2, H, L, 32)
    assert_same_bits(out, sdpa(q, kd, vd))
    ref = F.scaled_dot_product_attention(q, kd, vd, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, kd, vd)
    assert_attention_bound(out, r, bound)
    # torch and numpy pairs give the same bits.
    qn, kn, vn = q.numpy(), tuple(a.numpy() for a in kp), tuple(a.numpy() for a in vp)
    assert_same_bits(out, sdpa(qn, kn, vn))


def test_int8_options_bitwise(rng):
    """Every option reaches the int8 path as it reaches the float one."""
    B, H, Hk, L, S, E = 2, 4, 2, 20, 90, 16
    q, kp, vp, kd, vd = int8_qkv(rng, B, H, Hk, L, S, E)
    mask = rng.uniform(size=(L, S)) < 0.8
    bias = rng.standard_normal((B, 1, L, S)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    for kw in (
        {"attn_mask": mask},
        {"bias": bias},
        {"window": (7, 2)},
        {"softcap": 2.0},
        {"sinks": sinks},
        {"kv_range": (10, 61)},
        {"scale": 0.3, "causal": True},
        {"attn_mask": mask, "bias": bias, "sinks": sinks, "causal": True, "softcap": 5.0},
    ):
        out, lse = sdpa(q, kp, vp, return_lse=True, **kw)
        ref_out, ref_lse = sdpa(q, kd, vd, return_lse=True, **kw)
        assert_same_bits(out, ref_out)
        assert_same_bits(lse, ref_lse)
        assert_same_bits(
            softdot.attention_weights(q, kp, **kw), softdot.attention_weights(q, kd, **kw)
        )
    # kv_range parts merged equal the whole range.
    oa, la = sdpa(q, kp, vp, kv_range=(0, 40), return_lse=True)
    ob, lb = sdpa(q, kp, vp, kv_range=(40, None), return_lse=True)
    om, _ = softdot.attention_merge(oa, la, ob, lb)
    whole = sdpa(q, kp, vp)
    r, _, bound, _, _ = attention_ref(q, kd, vd)
    assert_attention_bound(om, r, bound)
    assert_attention_bound(whole, r, bound)


def test_int8_2d_3d_5d(rng):
    q, kp, vp, kd, vd = int8_qkv(rng, 6, 2, 2, 5, 11, 8)
    q5, kp5, vp5 = (
        q.reshape(2, 3, 2, 5, 8),
        tuple(a.reshape(2, 3, 2, 11, -1) for a in kp),
        tuple(a.reshape(2, 3, 2, 11, -1) for a in vp),
    )
    out5 = sdpa(q5, kp5, vp5)
    assert out5.shape == (2, 3, 2, 5, 8)
    assert_same_bits(out5.reshape(q.shape), sdpa(q, kp, vp))
    out3 = sdpa(q[0], tuple(a[0] for a in kp), tuple(a[0] for a in vp))
    assert out3.shape == (2, 5, 8)
    assert_same_bits(out3, sdpa(q[0], kd[0], vd[0]))
    out2 = sdpa(q[0, 1], tuple(a[0, 1] for a in kp), tuple(a[0, 1] for a in vp))
    assert out2.shape == (5, 8)
    assert_same_bits(out2, sdpa(q[0, 1], kd[0, 1], vd[0, 1]))
    w2 = softdot.attention_weights(q[0, 1], tuple(a[0, 1] for a in kp))
    assert_same_bits(w2, softdot.attention_weights(q[0, 1], kd[0, 1]))


def test_int8_quantisation_error_end_to_end(rng):
    """Against attention on the original float keys and values: the
    difference is the quantisation's, well under 1% of the output scale
    here (a sanity check of the whole path, not a stated bound)."""
    q = rng.standard_normal((1, 4, 16, 64)).astype(np.float32)
    k = rng.standard_normal((1, 4, 200, 64)).astype(np.float32)
    v = rng.standard_normal((1, 4, 200, 64)).astype(np.float32)
    out = sdpa(q, softdot.quantize_kv(k), softdot.quantize_kv(v))
    exact = sdpa(q, k, v)
    assert np.max(np.abs(out - exact)) < 0.01 * np.max(np.abs(exact))
    assert not np.array_equal(out, exact)


def test_int8_zero_scale_and_strided_scales(rng):
    """Scales of 0 (every value reads 0), broadcast scales (stride 0: one
    scale per head, copied to one per row since the core reads a scale per
    row) and scales inside a wider buffer (read in place)."""
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    values = rng.integers(-127, 128, (1, 2, 9, 8)).astype(np.int8)
    per_head = np.array([0.0, 0.25], np.float32).reshape(1, 2, 1, 1)
    scales = np.broadcast_to(per_head, (1, 2, 9, 1))
    assert scales.strides[2] == 0
    out = sdpa(q, (values, scales), (values, scales))
    d = dequantize(values, scales)
    assert np.all(d[0, 0] == 0)
    assert_same_bits(out, sdpa(q, d, d))
    buf = np.zeros((1, 2, 9, 4), np.float32)
    buf[..., 2:3] = rng.uniform(0, 1, (1, 2, 9, 1))
    s = buf[..., 2:3]
    assert_same_bits(
        sdpa(q, (values, s), (values, s)), sdpa(q, dequantize(values, s), dequantize(values, s))
    )


def test_int8_no_copy(rng):
    """int8 values and scales are read where they lie: C order and the
    transposed view of [B, S, H, E] storage (a cache laid out by token)."""
    B, L, H, E, S = 2, 64, 4, 64, 1024
    q = np.swapaxes(rng.standard_normal((B, L, H, E)).astype(np.float32), 1, 2)
    kb = rng.integers(-127, 128, (B, S, H, E)).astype(np.int8)
    vb = rng.integers(-127, 128, (B, S, H, E)).astype(np.int8)
    sb = rng.uniform(0, 0.05, (B, S, H, 2)).astype(np.float32)
    kp = (np.swapaxes(kb, 1, 2), np.swapaxes(sb[..., :1], 1, 2))
    vp = (np.swapaxes(vb, 1, 2), np.swapaxes(sb[..., 1:], 1, 2))
    out = np.empty((B, H, L, E), np.float32)
    peak = peak_bytes(lambda: sdpa(q, kp, vp, causal=True, out=out))
    assert peak < NO_COPY_LIMIT, peak
    kd, vd = dequantize(*kp), dequantize(*vp)
    assert_same_bits(out, sdpa(q, kd, vd, causal=True))
    w = np.empty((B, H, L, S), np.float32)
    peak = peak_bytes(lambda: softdot.attention_weights(q, kp, out=w))
    assert peak < NO_COPY_LIMIT, peak


def test_torch_int8_transposed_is_zero_copy(rng):
    """The numpy views the package hands over share the tensors' memory:
    what the core reads is the cache itself (data_ptr)."""
    from softdot import _int8

    kb = torch.from_numpy(rng.integers(-127, 128, (1, 50, 2, 16)).astype(np.int8))
    sb = torch.from_numpy(rng.uniform(0, 1, (1, 50, 2, 1)).astype(np.float32))
    pair = (kb.transpose(1, 2), sb.transpose(1, 2))
    values, scales = _int8.int8_kv("f", "key", pair, "torch")
    assert values.__array_interface__["data"][0] == kb.data_ptr()
    assert scales.__array_interface__["data"][0] == sb.data_ptr()
    q = torch.from_numpy(rng.standard_normal((1, 4, 3, 16)).astype(np.float32))
    out = sdpa(q, pair, pair)
    d = dequantize(*pair)
    assert_same_bits(out, sdpa(q, d, d))


def test_int8_scale_errors_name_the_scale(rng):
    q, kp, vp, _, _ = int8_qkv(rng, 2, 4, 2, 3, 9, 8)
    for bad in (-1.0, np.inf, np.nan):
        ks = kp[1].copy()
        ks[1, 0, 6, 0] = bad
        out = np.full((2, 4, 3, 8), 5, np.float32)
        with pytest.raises(
            ValueError,
            match=r"scaled_dot_product_attention: key scales"
            r"\[1, 0, 6, 0\] = .*; scales must be finite and >= 0",
        ):
            sdpa(q, (kp[0], ks), vp, out=out)
        assert np.all(out == 5)  # nothing written
        vs = vp[1][1].copy()  # 3-d, so the index is the caller's, not the 4-d view's
        vs[1, 2, 0] = bad
        with pytest.raises(ValueError, match=r"value scales\[1, 2, 0\]"):
            sdpa(q[1], tuple(a[1] for a in kp), (vp[0][1], vs))
        with pytest.raises(ValueError, match=r"attention_weights: key scales\[1, 0, 6, 0\]"):
            softdot.attention_weights(q, (kp[0], ks))
    # A scale outside kv_range is checked too: every scale must be valid.
    ks = kp[1].copy()
    ks[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"key scales\[0, 0, 0, 0\]"):
        sdpa(q, (kp[0], ks), vp, kv_range=(4, None))


Q = np.ones((2, 4, 3, 8), np.float32)
KV = np.ones((2, 2, 5, 8), np.int8)
KS = np.ones((2, 2, 5, 1), np.float32)
P = (KV, KS)
T = tuple(torch.from_numpy(a) for a in P)

INT8_ERRORS = [
    (
        "key int8 value float",
        lambda: sdpa(Q, P, KV.astype(np.float32)),
        TypeError,
        r"key has dtype int8 \(a \(values, scales\) pair\) but value has dtype float32",
    ),
    (
        "key float value int8",
        lambda: sdpa(Q, KV.astype(np.float16), P),
        TypeError,
        r"key has dtype float16 but value has dtype int8",
    ),
    (
        "int8 without scales",
        lambda: sdpa(Q, KV, KV),
        TypeError,
        r"key has dtype int8; accepted: .*a pair \(int8 values, float32 scales\)",
    ),
    (
        "values uint8",
        lambda: sdpa(Q, (KV.view(np.uint8), KS), P),
        TypeError,
        r"key values has dtype uint8; accepted: int8",
    ),
    (
        "values float32",
        lambda: sdpa(Q, (KS * np.ones(8, np.float32), KS), P),
        TypeError,
        r"key values has dtype float32; accepted: int8",
    ),
    (
        "scales float64",
        lambda: sdpa(Q, P, (KV, KS.astype(np.float64))),
        TypeError,
        r"value scales has dtype float64; accepted: float32",
    ),
    (
        "scales without the unit axis",
        lambda: sdpa(Q, (KV, KS[..., 0]), P),
        ValueError,
        r"key scales has shape \(2, 2, 5\); expected \(2, 2, 5, 1\) for key values of shape "
        r"\(2, 2, 5, 8\)",
    ),
    (
        "scales of other rows",
        lambda: sdpa(Q, P, (KV, KS[:, :, :4])),
        ValueError,
        r"value scales has shape \(2, 2, 4, 1\); expected \(2, 2, 5, 1\)",
    ),
    (
        "values 1-d",
        lambda: sdpa(Q, (KV[0, 0, 0], KS[0, 0, 0]), P),
        ValueError,
        r"key values has shape \(8,\)",
    ),
    (
        "values d mismatch",
        lambda: sdpa(Q, (KV[..., :7], KS), P),
        ValueError,
        r"the last axes, E, must match",
    ),
    ("values heads not a divisor", lambda: sdpa(Q[:, :3], P, P), ValueError, r"multiple of key's"),
    (
        "numpy pair for torch query",
        lambda: sdpa(torch.from_numpy(Q), P, T),
        TypeError,
        r"key values must be a torch.Tensor when the main input is one",
    ),
    (
        "torch pair for numpy query",
        lambda: sdpa(Q, T, P),
        TypeError,
        r"key values is a torch.Tensor but the main input is a numpy array",
    ),
    (
        "torch scales float64",
        lambda: sdpa(torch.from_numpy(Q), (T[0], T[1].double()), T),
        TypeError,
        r"key scales has dtype float64; accepted: float32",
    ),
    (
        "out overlaps key scales",
        lambda: (lambda b: sdpa(Q, (KV, b.reshape(2, 96)[:, :10].reshape(2, 2, 5, 1)), P, out=b))(
            np.ones((2, 4, 3, 8), np.float32)
        ),
        ValueError,
        r"out overlaps key scales",
    ),
]


@pytest.mark.parametrize("name,call,exc,match", INT8_ERRORS, ids=[e[0] for e in INT8_ERRORS])
def test_int8_errors(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_a_tuple_of_numbers_is_still_an_array():
    """Only a tuple of two arrays is a (values, scales) pair: a nested tuple
    of numbers stays an array-like, as before."""
    q = np.eye(2, dtype=np.float32)
    k = ((1.0, 0.0), (0.0, 1.0))
    with pytest.raises(TypeError, match=r"key has dtype float64"):
        sdpa(q, k, k)
    # Float32 arrays in a tuple of rows are stacked as numpy stacks them.
    kf = np.array(k, np.float32)
    rows = (kf[0], kf[1], kf[0])
    assert_same_bits(sdpa(q, rows, np.stack(rows)), sdpa(q, np.stack(rows), np.stack(rows)))


def test_int8_calls_release_the_gil(rng):
    """quantize_kv and attention on int8 pairs release the GIL while the core
    computes (test_gil.py's observation, without timing)."""
    from test_gil import assert_progress

    q = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    k = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    kp = softdot.quantize_kv(k)
    out = np.empty_like(q)
    assert_progress(lambda: softdot.scaled_dot_product_attention(q, kp, kp, out=out))
    x = rng.standard_normal((8, 8, 4096, 64)).astype(np.float32)  # 64 MiB
    o = (np.empty(x.shape, np.int8), np.empty(x.shape[:-1] + (1,), np.float32))
    assert_progress(lambda: softdot.quantize_kv(x, out=o))
