"""fp8 K/V caches (float8_e4m3fn, float8_e5m2) from Python: torch's float8
tensors and ml_dtypes' arrays, with vLLM's per-tensor k_scale / v_scale and
SGLang's per token and head. Each result equals, bit for bit, the float32 call
on the dequantised values (scale * value rounded once to float32); write_kv
quantises into fp8 pages (saturating with a per-tensor scale) and the errors
name the argument."""

import ml_dtypes
import numpy as np
import pytest
import torch

import softdot

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
FMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def random_fp8(shape, dtype, gen):
    """Every finite pattern (no NaN, no infinity), subnormals included."""
    b = torch.randint(0, 256, shape, generator=gen, dtype=torch.int16).to(torch.uint8)
    x = b.view(dtype)
    bad = ~torch.isfinite(x.float())
    return torch.where(bad, torch.zeros((), dtype=dtype), x.float().to(dtype)) if bad.any() else x


def dequant(x, scale):
    """scale * value in float32, one rounding (the contract)."""
    return x.float() * (scale[..., None] if torch.is_tensor(scale) else scale)


def paged_case(dtype, layout, gen, per_token):
    P, ps, Hkv, E = 7, 16, 2, 64
    shape = (P, ps, Hkv, E) if layout == "NHD" else (P, Hkv, ps, E)
    k = random_fp8(shape, dtype, gen)
    v = random_fp8(shape, dtype, gen)
    top = 1.0 / FMAX[dtype]
    if per_token:
        ks = (torch.rand(shape[:-1], generator=gen) + 0.5) * top
        vs = (torch.rand(shape[:-1], generator=gen) + 0.5) * top
    else:
        ks, vs = 0.75 * top, 1.25 * top
    return k, v, ks, vs


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("per_token", [False, True])
def test_paged_equals_float_cache_of_dequantised_values(dtype, layout, per_token):
    gen = torch.Generator().manual_seed(3)
    k, v, ks, vs = paged_case(dtype, layout, gen, per_token)
    q = torch.randn(3, 8, 1, 64, generator=gen)
    bt = torch.tensor([[4, 1, 6], [0, 2, -1], [5, -1, -1]], dtype=torch.int32)
    sl = torch.tensor([40, 17, 9], dtype=torch.int32)
    o, lse = softdot.paged_attention(
        q, k, v, bt, sl, k_scale=ks, v_scale=vs, kv_layout=layout, return_lse=True
    )
    o2, lse2 = softdot.paged_attention(
        q, dequant(k, ks), dequant(v, vs), bt, sl, kv_layout=layout, return_lse=True
    )
    assert torch.equal(o.view(torch.int32), o2.view(torch.int32))
    assert torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    # A ragged batch (decode and prefill rows) too.
    qr = torch.randn(1 + 5 + 2, 8, 64, generator=gen)
    qsl = torch.tensor([0, 1, 6, 8], dtype=torch.int32)
    kw = dict(kv_layout=layout, query_start_loc=qsl)
    r = softdot.paged_attention(qr, k, v, bt, sl, k_scale=ks, v_scale=vs, **kw)
    r2 = softdot.paged_attention(qr, dequant(k, ks), dequant(v, vs), bt, sl, **kw)
    assert torch.equal(r.view(torch.int32), r2.view(torch.int32))


@pytest.mark.parametrize("dtype", FORMATS)
def test_contiguous_torch_and_numpy(dtype):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 3, 32, generator=gen)
    k = random_fp8((2, 2, 50, 32), dtype, gen)
    v = random_fp8((2, 2, 50, 32), dtype, gen)
    ks = (torch.rand(2, 2, 50, generator=gen) + 0.5) / FMAX[dtype]
    for k_scale, v_scale in ((0.01, 0.02), (ks, 0.03)):
        o = softdot.scaled_dot_product_attention(
            q, k, v, causal=True, k_scale=k_scale, v_scale=v_scale
        )
        want = softdot.scaled_dot_product_attention(
            q, dequant(k, k_scale), dequant(v, v_scale), causal=True
        )
        assert torch.equal(o.view(torch.int32), want.view(torch.int32))
    # numpy: ml_dtypes' float8 arrays, the same bits.
    np_dtype = ml_dtypes.float8_e4m3fn if dtype == torch.float8_e4m3fn else ml_dtypes.float8_e5m2
    kn = k.view(torch.uint8).numpy().view(np_dtype)
    vn = v.view(torch.uint8).numpy().view(np_dtype)
    on = softdot.scaled_dot_product_attention(
        q.numpy(), kn, vn, causal=True, k_scale=0.01, v_scale=0.02
    )
    want = softdot.scaled_dot_product_attention(
        q, dequant(k, 0.01), dequant(v, 0.02), causal=True
    ).numpy()
    assert np.array_equal(on.view(np.int32), want.view(np.int32))


def test_weights_of_an_fp8_key():
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 3, 16, generator=gen)
    k = random_fp8((1, 2, 9, 16), torch.float8_e4m3fn, gen)
    ks = torch.rand(1, 2, 9, generator=gen) / 448
    for scale in (0.01, ks):
        w = softdot.attention_weights(q, k, k_scale=scale, causal=True)
        want = softdot.attention_weights(q, dequant(k, scale), causal=True)
        assert torch.equal(w.view(torch.int32), want.view(torch.int32))


def test_nan_in_the_cache_is_not_hidden():
    q = torch.randn(1, 2, 1, 16)
    k = torch.randn(1, 1, 20, 16).to(torch.float8_e4m3fn)
    v = torch.randn(1, 1, 20, 16).to(torch.float8_e4m3fn)
    k.view(torch.uint8)[0, 0, 7, 3] = 0x7F  # e4m3fn's NaN
    o = softdot.scaled_dot_product_attention(q, k, v, k_scale=0.5)
    assert torch.isnan(o).all()


@pytest.mark.parametrize("dtype", FORMATS)
def test_write_kv_per_tensor_rounds_and_saturates(dtype):
    P, ps, Hkv, E = 4, 8, 2, 32
    kc = torch.zeros(P, ps, Hkv, E, dtype=dtype)
    vc = torch.zeros_like(kc)
    key = torch.randn(3, Hkv, E) * FMAX[dtype] * 0.25
    key[1, 0, :4] = torch.tensor([1e30, -1e30, 3 * FMAX[dtype], -3 * FMAX[dtype]])
    val = torch.randn(3, Hkv, E)
    softdot.write_kv(key, val, kc, vc, torch.tensor([5, 17, -1]), k_scale=0.5, v_scale=0.25)
    # x / scale (a power of two: exact) rounded to nearest even, saturated.
    want = (key[:2] / 0.5).clamp(-FMAX[dtype], FMAX[dtype]).to(dtype)
    got = torch.stack([kc[0, 5], kc[2, 1]])
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert kc[1, 5, 0, 0].view(torch.uint8) == 0  # slot -1: nothing written
    wv = (val[:2] / 0.25).to(dtype)
    assert torch.equal(torch.stack([vc[0, 5], vc[2, 1]]).view(torch.uint8), wv.view(torch.uint8))


@pytest.mark.parametrize("dtype", FORMATS)
def test_write_kv_per_token_then_attend(dtype):
    P, ps, Hkv, E = 5, 8, 2, 32
    kc = torch.zeros(P, ps, Hkv, E, dtype=dtype)
    vc = torch.zeros_like(kc)
    ks = torch.full((P, ps, Hkv), float("nan"))
    vs = torch.full((P, ps, Hkv), float("nan"))
    gen = torch.Generator().manual_seed(9)
    key = torch.randn(20, Hkv, E, generator=gen) * 3
    val = torch.randn(20, Hkv, E, generator=gen)
    slots = torch.arange(20) + 8  # pages 1, 2 and half of 3
    softdot.write_kv(key, val, kc, vc, slots, k_scale=ks, v_scale=vs)
    amax = key.abs().amax(-1)
    assert torch.equal(ks.reshape(-1, Hkv)[8:28], amax / FMAX[dtype])
    # The bound of kv_cache.h per element.
    m, emin = (3, -6) if dtype == torch.float8_e4m3fn else (2, -14)
    deq = dequant(kc, ks).reshape(-1, Hkv, E)[8:28]
    bound = (
        2.0 ** -(m + 1) * key.abs() * (1 + 2**-20)
        + 2.0 ** (emin - m - 1) * (ks.reshape(-1, Hkv)[8:28, :, None])
    )
    assert ((deq - key).abs() <= bound).all()
    # Write and attend in one call: the bits of the two calls.
    q = torch.randn(1, 4, 1, E, generator=gen)
    bt = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    sl = torch.tensor([21], dtype=torch.int32)  # slots 8 to 28
    new_k = torch.randn(1, Hkv, E, generator=gen)
    new_v = torch.randn(1, Hkv, E, generator=gen)
    o = softdot.paged_attention(
        q, kc, vc, bt, sl, k_scale=ks, v_scale=vs, kv_write=(new_k, new_v, torch.tensor([28]))
    )
    o2 = softdot.paged_attention(q, dequant(kc, ks), dequant(vc, vs), bt, sl)
    assert torch.equal(o.view(torch.int32), o2.view(torch.int32))


def test_errors_name_the_argument():
    q = torch.randn(1, 2, 1, 16)
    kf = torch.randn(3, 4, 1, 16)
    k8 = kf.to(torch.float8_e4m3fn)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    sl = torch.tensor([6], dtype=torch.int32)
    with pytest.raises(ValueError, match="k_scale is given but the cache is float32"):
        softdot.paged_attention(q, kf, kf, bt, sl, k_scale=0.5)
    with pytest.raises(
        ValueError, match=r"v_scale has shape \(3, 4\); expected a float or \(3, 4, 1\)"
    ):
        softdot.paged_attention(q, k8, k8, bt, sl, v_scale=torch.ones(3, 4))
    with pytest.raises(ValueError, match="k_scale = -1.0 must be finite and >= 0"):
        softdot.paged_attention(q, k8, k8, bt, sl, k_scale=-1.0)
    with pytest.raises(TypeError, match="same dtype"):
        softdot.paged_attention(q, k8, kf.to(torch.float8_e5m2), bt, sl)
    # Per-token scales are checked where a key reads them.
    ks = torch.ones(3, 4, 1)
    ks[1, 1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"scales\[1, 0, 1\] = nan \(sequence 0, position 5\)"):
        softdot.paged_attention(q, k8, k8, bt, sl, k_scale=ks)
    # write_kv: only finite rows into fp8 pages, scale > 0; nothing written.
    kc = torch.zeros(3, 4, 1, 16, dtype=torch.float8_e4m3fn)
    key = torch.ones(2, 1, 16)
    key[1, 0, 5] = float("inf")
    with pytest.raises(ValueError, match=r"key holds inf at \[1, 0, 5\] \(slot 1\)"):
        softdot.write_kv(key, key.clone(), kc, kc.clone(), torch.tensor([0, 1]), k_scale=1.0)
    assert not kc.view(torch.uint8).any()
    with pytest.raises(ValueError, match="scale = 0 must be finite and > 0"):
        softdot.write_kv(
            torch.ones(1, 1, 16),
            torch.ones(1, 1, 16),
            kc,
            kc.clone(),
            torch.tensor([0]),
            k_scale=0.0,
        )
    # No gradient through an fp8 cache.
    qr = q.clone().requires_grad_()
    kk = torch.randn(1, 1, 5, 16).to(torch.float8_e5m2)
    with pytest.raises(NotImplementedError, match="fp8 K/V cache has no gradient"):
        softdot.scaled_dot_product_attention(qr, kk, kk, k_scale=2.0)
    with pytest.raises(TypeError, match="float8_e5m2"):
        softdot.scaled_dot_product_attention(qr, kk, kk)
