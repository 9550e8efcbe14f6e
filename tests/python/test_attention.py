"""scaled_dot_product_attention, attention_weights and attention_merge on
numpy arrays and CPU tensors: the worked example, a float64 reference at the
header's stated error bound (|O - exact| <= (2D + 70u) W + u|exact| + ...),
torch.nn.functional.scaled_dot_product_attention (GQA, causal top-left and
bottom-right, bool and float masks, float16 / bfloat16 K and V), numpy
float16 and ml_dtypes.bfloat16 K and V, sinks, window, softcap, bias,
kv_range split and merge, return_lse, the explicit weights, 2-d to 5-d and
strided inputs, and fully masked rows."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softdot

from conftest import U32, assert_attention_bound, attention_ref, to_f64, visibility

sdpa = softdot.scaled_dot_product_attention

# Unit-scale data: torch's float32 result and softdot's agree to a few u*W,
# far inside these (the brief's) tolerances.
RTOL, ATOL = 1e-5, 1e-6


def qkv(rng, B, H, Hk, L, S, E, Ev=None, kv_dtype=np.float32):
    Ev = E if Ev is None else Ev
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = rng.standard_normal((B, Hk, S, E)).astype(kv_dtype)
    v = rng.standard_normal((B, Hk, S, Ev)).astype(kv_dtype)
    return q, k, v


def torch_ref(q, k, v, **kw):
    """torch's attention in float32 on float32 copies of the inputs."""
    t = [
        torch.from_numpy(np.ascontiguousarray(to_f64(a).astype(np.float32)))
        if not isinstance(a, torch.Tensor)
        else a.float()
        for a in (q, k, v)
    ]
    return F.scaled_dot_product_attention(*t, **kw).numpy()


def lse_tolerance(D, ref_lse):
    """lse is the log-sum-exp of the float scores: off by at most their
    error D plus a few roundings."""
    return D + 4 * U32 * (np.abs(ref_lse) + 1)


# ---- the worked example ---------------------------------------------------------------


def test_readme_example():
    Q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    K = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    V = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    out = sdpa(Q, K, V, causal=True)
    assert out.dtype == np.float32 and out.shape == (2, 2)
    assert [f"{v:.4f}" for v in out.ravel()] == ["1.6605", "2.6605", "3.4067", "4.4067"]
    ref, _, bound, _, _ = attention_ref(Q, K, V, causal=True)
    assert_attention_bound(out, ref, bound)
    t = sdpa(torch.from_numpy(Q), torch.from_numpy(K), torch.from_numpy(V), causal=True)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy(), out)


# ---- float64 reference at the stated bound ------------------------------------------------


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
def test_against_reference(rng, B, H, Hk, L, S, E, Ev, causal):
    q, k, v = qkv(rng, B, H, Hk, L, S, E, Ev)
    copies = [a.copy() for a in (q, k, v)]
    out, lse = sdpa(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (B, H, L, Ev) and lse.shape == (B, H, L)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    ref, ref_lse, bound, D, _ = attention_ref(q, k, v, causal=causal)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    assert np.all(np.abs(lse - ref_lse) <= lse_tolerance(D, ref_lse))
    for a, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(a, c)
    # return_lse does not change the output.
    np.testing.assert_array_equal(sdpa(q, k, v, causal=causal), out)


def test_lse_is_logsumexp_of_scores(rng):
    q, k, v = qkv(rng, 1, 2, 2, 9, 33, 16)
    _, lse = sdpa(q, k, v, return_lse=True)
    scores = (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) / 4.0
    m = scores.max(-1, keepdims=True)
    ref = (m + np.log(np.exp(scores - m).sum(-1, keepdims=True)))[..., 0]
    _, _, _, D, _ = attention_ref(q, k, v)
    assert np.all(np.abs(lse - ref) <= lse_tolerance(D, ref))
    np.testing.assert_allclose(lse, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("scale", [0.05, 1.0, 0.3])
def test_scale(rng, scale):
    q, k, v = qkv(rng, 1, 2, 1, 20, 50, 8)
    out = sdpa(q, k, v, scale=scale)
    ref, _, bound, _, _ = attention_ref(q, k, v, scale=scale)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_allclose(
        out, torch_ref(q, k, v, scale=scale, enable_gqa=True), rtol=RTOL, atol=ATOL
    )


# ---- torch --------------------------------------------------------------------------------


@pytest.mark.parametrize("H,Hk", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("L", [1, 24])
def test_torch_gqa(rng, H, Hk, L):
    q, k, v = (torch.from_numpy(a) for a in qkv(rng, 2, H, Hk, L, 70, 32))
    out = sdpa(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (2, H, L, 32)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, k, v)
    assert_attention_bound(out, r, bound)


def test_torch_causal_square_is_torch_is_causal(rng):
    q, k, v = (torch.from_numpy(a) for a in qkv(rng, 2, 3, 3, 45, 45, 16))
    out = sdpa(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("L,S", [(5, 40), (30, 31), (1, 17)])
def test_torch_causal_bottom_right(rng, L, S):
    q, k, v = (torch.from_numpy(a) for a in qkv(rng, 1, 4, 2, L, S, 16))
    out = sdpa(q, k, v, causal=True)
    mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    # The same mask passed to softdot gives the same bits as causal=True
    # (both mask the same keys).
    np.testing.assert_array_equal(sdpa(q, k, v, mask).numpy(), out.numpy())
    # torch's top-left rule through an explicit mask.
    tl = torch.ones(L, S, dtype=torch.bool).tril()
    np.testing.assert_allclose(
        sdpa(q, k, v, tl).numpy(),
        F.scaled_dot_product_attention(q, k, v, attn_mask=tl, enable_gqa=True).numpy(),
        rtol=RTOL,
        atol=ATOL,
    )


@pytest.mark.parametrize("mask_shape", [(20, 50), (1, 20, 50), (2, 4, 20, 50), (4, 1, 50)])
def test_torch_bool_mask(rng, mask_shape):
    q, k, v = (torch.from_numpy(a) for a in qkv(rng, 2, 4, 4, 20, 50, 16))
    m = torch.from_numpy(rng.random(mask_shape) < 0.7)
    m[..., 0] = True  # no fully masked row (torch gives NaN there)
    out = sdpa(q, k, v, m)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, k, v, m.numpy())
    assert_attention_bound(out, r, bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_torch_float_mask(rng, dtype):
    q, k, v = (torch.from_numpy(a) for a in qkv(rng, 2, 4, 2, 20, 50, 16))
    m = torch.from_numpy(rng.standard_normal((20, 50))).to(dtype)
    m[3, 5:] = -math.inf
    out = sdpa(q, k, v, m)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m.float(), enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, k, v, m.float().numpy())
    assert_attention_bound(out, r, bound)


@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("L", [1, 33])
def test_torch_16bit_kv(rng, kv, L):
    q, k, v = qkv(rng, 2, 4, 2, L, 90, 32)
    q = torch.from_numpy(q)
    k, v = torch.from_numpy(k).to(kv), torch.from_numpy(v).to(kv)
    out = sdpa(q, k, v, causal=True)
    L_, S = L, 90
    mask = torch.ones(L_, S, dtype=torch.bool).tril(diagonal=S - L_)
    ref = F.scaled_dot_product_attention(q, k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, k, v, causal=True)
    assert_attention_bound(out, r, bound)
    # Widening is exact: the same as float32 copies of the keys and values.
    np.testing.assert_array_equal(out.numpy(), sdpa(q, k.float(), v.float(), causal=True).numpy())


@pytest.mark.parametrize("kv", [np.float16, ml_dtypes.bfloat16])
def test_numpy_16bit_kv(rng, kv):
    q, k, v = qkv(rng, 1, 4, 4, 12, 60, 16)
    k16, v16 = k.astype(kv), v.astype(kv)
    kc, vc = k16.copy(), v16.copy()
    out = sdpa(q, k16, v16)
    k32, v32 = k16.astype(np.float32), v16.astype(np.float32)
    np.testing.assert_array_equal(out, sdpa(q, k32, v32))
    np.testing.assert_allclose(out, torch_ref(q, k32, v32), rtol=RTOL, atol=ATOL)
    r, _, bound, _, _ = attention_ref(q, k32, v32)
    assert_attention_bound(out, r, bound)
    w = softdot.attention_weights(q, k16)
    np.testing.assert_array_equal(w, softdot.attention_weights(q, k32))
    np.testing.assert_array_equal(k16.view(np.uint16), kc.view(np.uint16))
    np.testing.assert_array_equal(v16.view(np.uint16), vc.view(np.uint16))


# ---- options ----------------------------------------------------------------------


@pytest.mark.parametrize("window", [(4, 0), (3, 2), (-1, 5), (0, 0), (10, -1)])
def test_window(rng, window):
    q, k, v = qkv(rng, 1, 2, 2, 30, 40, 16)
    out = sdpa(q, k, v, window=window)
    ref, _, bound, _, _ = attention_ref(q, k, v, window=window)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    vis = visibility(30, 40, window=window)
    tm = torch.from_numpy(vis)
    np.testing.assert_allclose(out, torch_ref(q, k, v, attn_mask=tm), rtol=RTOL, atol=ATOL)
    # causal is window_right = 0.
    if window[1] == 0:
        np.testing.assert_array_equal(out, sdpa(q, k, v, causal=True, window=(window[0], -1)))


@pytest.mark.parametrize("softcap", [1.0, 5.0, 30.0])
def test_softcap(rng, softcap):
    q, k, v = qkv(rng, 1, 2, 1, 25, 60, 16)
    q *= 3
    out = sdpa(q, k, v, softcap=softcap)
    ref, _, bound, _, _ = attention_ref(q, k, v, softcap=softcap)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    w = softdot.attention_weights(q, k, softcap=softcap)
    _, _, _, D, wref = attention_ref(q, k, None, softcap=softcap)
    assert np.all(np.abs(w - wref) <= (2 * D[..., None] + U32) * wref + 2.0**-149)


def test_sinks(rng):
    q, k, v = qkv(rng, 2, 4, 2, 10, 30, 16)
    sinks = np.array([0.0, 1.5, -2.0, 4.0], dtype=np.float32)
    out, lse = sdpa(q, k, v, sinks=sinks, return_lse=True)
    ref, ref_lse, bound, D, w = attention_ref(q, k, v, sinks=sinks)
    assert_attention_bound(out, ref, bound)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    assert np.all(np.abs(lse - ref_lse) <= lse_tolerance(D, ref_lse))
    # The weights sum to less than 1: the sink's share is missing.
    W = softdot.attention_weights(q, k, sinks=sinks)
    share = W.astype(np.float64).sum(-1)
    np.testing.assert_allclose(share, w.sum(-1), rtol=1e-5)
    assert np.all(share < 1)
    # float64 sinks are converted; torch sinks for torch inputs.
    np.testing.assert_array_equal(sdpa(q, k, v, sinks=sinks.astype(np.float64)), out)
    t = sdpa(*(torch.from_numpy(a) for a in (q, k, v)), sinks=torch.from_numpy(sinks))
    np.testing.assert_array_equal(t.numpy(), out)


def test_bias_and_float_mask_add(rng):
    q, k, v = qkv(rng, 1, 2, 2, 12, 20, 8)
    bias = rng.standard_normal((12, 20)).astype(np.float32)
    m2 = rng.standard_normal((2, 12, 20)).astype(np.float32)
    out = sdpa(q, k, v, bias=bias)
    ref, _, bound, _, _ = attention_ref(q, k, v, bias=bias)
    assert_attention_bound(out, ref, bound)
    both = sdpa(q, k, v, m2, bias=bias)
    ref, _, bound, _, _ = attention_ref(q, k, v, bias=(bias + m2.astype(np.float64)))
    np.testing.assert_allclose(both, ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(sdpa(q, k, v, bias), out)  # a float mask is a bias
    # Boolean mask and bias together.
    keep = rng.random((12, 20)) < 0.7
    keep[:, 0] = True
    out = sdpa(q, k, v, keep, bias=bias)
    ref, _, bound, _, _ = attention_ref(q, k, v, keep, bias=bias)
    assert_attention_bound(out, ref, bound)


def test_infinite_scores_average_their_values(rng):
    q, k, v = qkv(rng, 1, 1, 1, 2, 6, 4)
    bias = np.zeros((2, 6), dtype=np.float32)
    bias[0, [1, 4]] = np.inf
    out = sdpa(q, k, v, bias=bias)
    np.testing.assert_allclose(
        out[0, 0, 0], (v[0, 0, 1].astype(np.float64) + v[0, 0, 4]) / 2, rtol=2 * U32
    )
    ref, _, bound, _, _ = attention_ref(q[..., 1:, :], k, v)
    assert_attention_bound(out[..., 1:, :], ref, bound)


# ---- kv_range and attention_merge ------------------------------------------------------


@pytest.mark.parametrize("L", [1, 40])
@pytest.mark.parametrize("causal", [False, True])
def test_kv_range_split_and_merge(rng, L, causal):
    q, k, v = qkv(rng, 2, 4, 2, L, 150, 32, 24)
    v = np.abs(v) + np.float32(0.5)  # positive outputs: ulp distances meaningful
    full, lse = sdpa(q, k, v, causal=causal, return_lse=True)
    for b in (1, 64, 77, 149):
        oa, la = sdpa(q, k, v, causal=causal, return_lse=True, kv_range=(0, b))
        ob, lb = sdpa(q, k, v, causal=causal, return_lse=True, kv_range=(b, None))
        ref_a, ref_la, bound_a, _, _ = attention_ref(q, k, v, causal=causal, kv_range=(0, b))
        good = np.isfinite(ref_la)
        assert_attention_bound(np.where(good[..., None], oa, 0), ref_a, bound_a)
        assert np.all(oa[~good] == 0) and np.all(la[~good] == -np.inf)
        om, lm = softdot.attention_merge(oa, la, ob, lb)
        assert om.shape == full.shape and lm.shape == lse.shape
        ref, _, bound, _, _ = attention_ref(q, k, v, causal=causal)
        assert_attention_bound(om, ref, bound)
        np.testing.assert_array_max_ulp(om, full, maxulp=8)
        np.testing.assert_array_max_ulp(lm, lse, maxulp=2)
        # The merge is symmetric.
        om2, lm2 = softdot.attention_merge(ob, lb, oa, la)
        np.testing.assert_array_equal(om2, om)
        np.testing.assert_array_equal(lm2, lm)


def test_merge_three_ranges_and_identity(rng):
    q, k, v = qkv(rng, 1, 2, 1, 5, 90, 16)
    v = np.abs(v) + np.float32(0.5)
    full, lse = sdpa(q, k, v, return_lse=True)
    parts = [sdpa(q, k, v, return_lse=True, kv_range=r) for r in ((0, 30), (30, 61), (61, 90))]
    o, l = parts[0]
    for ob, lb in parts[1:]:
        o, l = softdot.attention_merge(o, l, ob, lb)
    np.testing.assert_array_max_ulp(o, full, maxulp=8)
    np.testing.assert_array_max_ulp(l, lse, maxulp=2)
    # An empty range is the identity: zeros and -inf.
    oe, le = sdpa(q, k, v, return_lse=True, kv_range=(40, 40))
    assert np.all(oe == 0) and np.all(le == -np.inf)
    om, lm = softdot.attention_merge(full, lse, oe, le)
    np.testing.assert_array_equal(om, full)
    np.testing.assert_array_equal(lm, lse)
    # Merging in place into out_a.
    a = parts[0][0].copy()
    r, _ = softdot.attention_merge(a, parts[0][1], parts[1][0], parts[1][1], out=a)
    assert r is a
    np.testing.assert_array_equal(a, softdot.attention_merge(*parts[0], *parts[1])[0])


def test_merge_reference_formula(rng):
    oa = rng.standard_normal((3, 4, 5)).astype(np.float32)
    ob = rng.standard_normal((3, 4, 5)).astype(np.float32)
    la = rng.standard_normal((3, 4)).astype(np.float32) * 3
    lb = rng.standard_normal((3, 4)).astype(np.float32) * 3
    la[0, 0] = -np.inf
    o, l = softdot.attention_merge(oa, la, ob, lb)
    m = np.maximum(la, lb).astype(np.float64)
    wa, wb = np.exp(la - m), np.exp(lb - m)
    ref = (wa[..., None] * oa + wb[..., None] * ob) / (wa + wb)[..., None]
    lref = m + np.log(wa + wb)
    # Computed in double, rounded once to float32.
    np.testing.assert_array_max_ulp(o, ref.astype(np.float32), maxulp=1)
    np.testing.assert_array_max_ulp(l, lref.astype(np.float32), maxulp=1)
    np.testing.assert_array_equal(o[0, 0], ob[0, 0])
    assert l[0, 0] == lb[0, 0]


# ---- attention_weights -----------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_weights(rng, causal):
    q, k, v = qkv(rng, 2, 4, 2, 30, 50, 16)
    w = softdot.attention_weights(q, k, causal=causal)
    assert w.shape == (2, 4, 30, 50) and w.dtype == np.float32
    _, _, _, D, wref = attention_ref(q, k, None, causal=causal)
    assert np.all(np.abs(w - wref) <= (2 * D[..., None] + U32) * wref + 2.0**-149)
    assert np.all((w > 0) == (wref > 0))
    assert np.all(w[wref == 0] == 0) and not np.signbit(w).any()
    np.testing.assert_allclose(w.astype(np.float64).sum(-1), 1.0, rtol=0, atol=50 * U32)
    out = sdpa(q, k, v, causal=causal)
    wv = w.astype(np.float64) @ np.repeat(v, 2, axis=1).astype(np.float64)
    ref, _, bound, _, _ = attention_ref(q, k, v, causal=causal)
    assert np.all(np.abs(wv - out) <= 2 * bound)
    np.testing.assert_allclose(wv, out, rtol=RTOL, atol=ATOL)
    # kv_range: keys outside get +0.
    wr = softdot.attention_weights(q, k, causal=causal, kv_range=(10, 35))
    assert np.all(wr[..., :10] == 0) and np.all(wr[..., 35:] == 0)
    _, _, _, D, wref = attention_ref(q, k, None, causal=causal, kv_range=(10, 35))
    assert np.all(np.abs(wr - wref) <= (2 * D[..., None] + U32) * wref + 2.0**-149)


def test_weights_torch(rng):
    q, k, _ = qkv(rng, 1, 2, 2, 7, 9, 4)
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    w = softdot.attention_weights(tq, tk)
    assert isinstance(w, torch.Tensor)
    ref = torch.softmax(tq @ tk.transpose(-1, -2) / 2.0, dim=-1)
    np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)


# ---- shapes and layouts ----------------------------------------------------------------


def test_2d_3d_5d(rng):
    q, k, v = qkv(rng, 1, 1, 1, 6, 11, 8)
    o4 = sdpa(q, k, v)
    o2 = sdpa(q[0, 0], k[0, 0], v[0, 0])
    assert o2.shape == (6, 8)
    np.testing.assert_array_equal(o2, o4[0, 0])
    o3, l3 = sdpa(q[0], k[0], v[0], return_lse=True)
    assert o3.shape == (1, 6, 8) and l3.shape == (1, 6)
    np.testing.assert_array_equal(o3, o4[0])
    q5 = rng.standard_normal((2, 3, 4, 6, 8)).astype(np.float32)
    k5 = rng.standard_normal((2, 3, 2, 11, 8)).astype(np.float32)
    v5 = rng.standard_normal((2, 3, 2, 11, 5)).astype(np.float32)
    o5, l5 = sdpa(q5, k5, v5, return_lse=True)
    assert o5.shape == (2, 3, 4, 6, 5) and l5.shape == (2, 3, 4, 6)
    o4 = sdpa(q5.reshape(6, 4, 6, 8), k5.reshape(6, 2, 11, 8), v5.reshape(6, 2, 11, 5))
    np.testing.assert_array_equal(o5.reshape(6, 4, 6, 5), o4)
    ref, _, bound, _, _ = attention_ref(q5, k5, v5)
    assert_attention_bound(o5, ref, bound)
    # Batch axes that cannot be merged (a transposed view) and a 5-d out.
    qt = np.swapaxes(q5, 0, 1)
    kt, vt = np.swapaxes(k5, 0, 1), np.swapaxes(v5, 0, 1)
    out = np.empty((3, 2, 4, 6, 5), dtype=np.float32)
    r = sdpa(qt, kt, vt, out=out)
    assert r is out
    np.testing.assert_array_equal(out, np.swapaxes(o5, 0, 1))
    outt = np.empty((2, 3, 4, 6, 5), dtype=np.float32)
    r = sdpa(qt, kt, vt, out=np.swapaxes(outt, 0, 1))
    assert np.shares_memory(r, outt)
    np.testing.assert_array_equal(outt, o5)
    w5 = softdot.attention_weights(q5, k5)
    assert w5.shape == (2, 3, 4, 6, 11)
    _, _, _, D, wref = attention_ref(q5, k5, None)
    assert np.all(np.abs(w5 - wref) <= (2 * D[..., None] + U32) * wref + 2.0**-149)


def test_torch_transposed_layout_is_zero_copy_and_same_bits(rng):
    B, L, S, H, Hk, E = 2, 19, 33, 4, 2, 16
    qb = torch.from_numpy(rng.standard_normal((B, L, H, E)).astype(np.float32))
    kb = torch.from_numpy(rng.standard_normal((B, S, Hk, E)).astype(np.float32))
    vb = torch.from_numpy(rng.standard_normal((B, S, Hk, E)).astype(np.float32))
    q, k, v = qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2)
    assert not q.is_contiguous() and q.data_ptr() == qb.data_ptr()
    out = sdpa(q, k, v, causal=True)
    dense = sdpa(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    np.testing.assert_array_equal(out.numpy(), dense.numpy())
    mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=RTOL, atol=ATOL)
    # An output in the [B, L, H, Ev] layout, written through its transpose.
    ob = torch.empty(B, L, H, E)
    r = sdpa(q, k, v, causal=True, out=ob.transpose(1, 2))
    assert r.data_ptr() == ob.data_ptr()
    np.testing.assert_array_equal(ob.transpose(1, 2).numpy(), out.numpy())


def test_numpy_strided_and_negative_strides(rng):
    q, k, v = qkv(rng, 1, 2, 2, 10, 20, 8)
    base = sdpa(q, k, v)
    # Every other query row / key row of a bigger array.
    qb = np.zeros((1, 2, 20, 8), dtype=np.float32)
    qb[:, :, ::2] = q
    kb = np.zeros((1, 2, 40, 8), dtype=np.float32)
    kb[:, :, ::2] = k
    np.testing.assert_array_equal(sdpa(qb[:, :, ::2], kb[:, :, ::2], v), base)
    # A strided last axis (copied) and reversed axes (copied for attention).
    qs = np.zeros((1, 2, 10, 16), dtype=np.float32)
    qs[..., ::2] = q
    np.testing.assert_array_equal(sdpa(qs[..., ::2], k, v), base)
    qr = q[:, :, ::-1].copy()[:, :, ::-1]
    np.testing.assert_array_equal(sdpa(qr, k, v), base)
    kr = k[:, ::-1].copy()[:, ::-1]
    np.testing.assert_array_equal(sdpa(q, kr, v), base)
    vf = np.asfortranarray(v)
    np.testing.assert_array_equal(sdpa(q, k, vf), base)


# ---- special rows ------------------------------------------------------------------------


def test_fully_masked_rows(rng):
    q, k, v = qkv(rng, 1, 2, 2, 8, 5, 4)
    # L > S with causal: the first L - S queries see no key.
    out, lse = sdpa(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :, :3] == 0) and not np.signbit(out[:, :, :3]).any()
    assert np.all(lse[:, :, :3] == -np.inf)
    ref, _, bound, _, _ = attention_ref(q[:, :, 3:], k, v, causal=True)
    assert_attention_bound(out[:, :, 3:], ref, bound)
    # A boolean mask row of all False.
    m = np.ones((8, 5), dtype=bool)
    m[2] = False
    out, lse = sdpa(q, k, v, m, return_lse=True)
    assert np.all(out[:, :, 2] == 0) and np.all(lse[:, :, 2] == -np.inf)
    assert np.all(np.isfinite(out))
    w = softdot.attention_weights(q, k, m)
    assert np.all(w[:, :, 2] == 0) and not np.signbit(w).any()
    # With a sink, lse is the sink and the output still zeros.
    sinks = np.array([0.5, -1.0], dtype=np.float32)
    out, lse = sdpa(q, k, v, m, sinks=sinks, return_lse=True)
    assert np.all(out[:, :, 2] == 0)
    np.testing.assert_array_equal(lse[0, :, 2], sinks)
    # Torch tensors: zeros, not NaN.
    t = sdpa(*(torch.from_numpy(a) for a in (q, k, v)), torch.from_numpy(m))
    assert torch.all(t[:, :, 2] == 0)


def test_nan_visible_poisons_masked_never_leaks(rng):
    q, k, v = qkv(rng, 1, 1, 1, 4, 6, 4)
    m = np.ones((4, 6), dtype=bool)
    m[:, 3] = False
    kn, vn = k.copy(), v.copy()
    kn[0, 0, 3, 0] = np.nan
    vn[0, 0, 3, 1] = np.inf
    out = sdpa(q, kn, vn, m)
    np.testing.assert_array_equal(out, sdpa(q, k, v, m))
    assert np.all(np.isfinite(out))
    # Visible: every row sees key 3, so every row is NaN.
    assert np.isnan(sdpa(q, kn, v)).all(axis=-1).all()
    # A NaN in one query row only affects that row.
    qn = q.copy()
    qn[0, 0, 1, 2] = np.nan
    o = sdpa(qn, k, v)
    assert np.isnan(o[0, 0, 1]).all()
    np.testing.assert_array_equal(o[0, 0, [0, 2, 3]], sdpa(q, k, v)[0, 0, [0, 2, 3]])
    # causal hides the last keys from the first queries: NaN there never leaks.
    vn = v.copy()
    vn[0, 0, 5] = np.nan
    o = sdpa(q, k, vn, causal=True)  # L=4, S=6: query i sees keys <= i + 2
    assert np.all(np.isfinite(o[0, 0, :3])) and np.isnan(o[0, 0, 3]).all()


def test_out_parameter(rng):
    q, k, v = qkv(rng, 1, 2, 2, 5, 7, 4)
    out = np.full((1, 2, 5, 4), 9.0, dtype=np.float32)
    r = sdpa(q, k, v, out=out)
    assert r is out
    np.testing.assert_array_equal(out, sdpa(q, k, v))
    r, lse = sdpa(q, k, v, out=out, return_lse=True)
    assert r is out and lse.shape == (1, 2, 5)
    w = np.empty((1, 2, 5, 7), dtype=np.float32)
    assert softdot.attention_weights(q, k, out=w) is w
    np.testing.assert_array_equal(w, softdot.attention_weights(q, k))


@pytest.mark.parametrize("causal", [False, True])
def test_precise_wide_scores(rng, causal):
    """precise=True keeps each score's rounding error out of the weights:
    with scores near +-100 it stays within a few u W of the float64 result,
    where the default (float scores) is tens of times further off."""
    L, S, E = 96, 300, 64
    q = (rng.standard_normal((1, 2, L, E)) * 6).astype(np.float32)
    k = (rng.standard_normal((1, 2, S, E)) * 6).astype(np.float32)
    v = rng.standard_normal((1, 2, S, E)).astype(np.float32)
    scale = float(np.float32(1 / math.sqrt(E)))
    s = np.einsum("bhld,bhsd->bhls", q.astype(np.float64), k.astype(np.float64)) * scale
    assert np.abs(s).max() > 100
    if causal:
        s[..., np.arange(S)[None, :] > np.arange(L)[:, None] + S - L] = -np.inf
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    want, W = w @ v.astype(np.float64), w @ np.abs(v.astype(np.float64))
    err = {}
    for precise in (False, True):
        got = softdot.scaled_dot_product_attention(
            q, k, v, causal=causal, scale=scale, precise=precise
        )
        err[precise] = float(np.max(np.abs(got - want) / (U32 * W)))
    assert err[True] <= 8, err
    assert err[False] > 8 * err[True], err


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_no_keys_gives_zeros_and_minus_inf(lib):
    # S = 0: numpy gives empty arrays strides of 0 and torch any strides; the
    # result is the library's for an empty key range (zeros, lse -inf), and
    # with a sink the sink's lse.
    q = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4)
    k = np.ones((1, 2, 0, 4), dtype=np.float32)
    v = np.ones((1, 2, 0, 5), dtype=np.float32)
    if lib == "torch":
        q, k, v = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
    out, lse = sdpa(q, k, v, return_lse=True)
    assert tuple(out.shape) == (1, 2, 3, 5)
    assert np.all(np.asarray(out) == 0)
    assert np.all(np.asarray(lse) == -np.inf)
    sinks = np.array([0.5, -1.0], dtype=np.float32)
    if lib == "torch":
        sinks = torch.from_numpy(sinks)
    out, lse = sdpa(q, k, v, return_lse=True, sinks=sinks)
    assert np.all(np.asarray(out) == 0)
    np.testing.assert_array_equal(np.asarray(lse)[0, :, 0], [0.5, -1.0])
