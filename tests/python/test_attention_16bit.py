"""16-bit attention from Python: bfloat16 and float16 queries (torch tensors,
numpy float16 and ml_dtypes.bfloat16 arrays) read as they are, outputs in the
query's dtype (or float32 when out= is float32), each within attention.h's
"16-bit attention" bound against float64 computed from the 16-bit inputs; the
matrix-unit switch (matrix_units, matrix_unit, force_matrix_unit) and
unit_weights; the same bits from numpy and torch and for 1 and 2 threads;
errors for what is not taken."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import softdot

U_BF16 = 2.0**-8
U_F16 = 2.0**-11


@pytest.fixture(autouse=True)
def _restore_unit():
    yield
    softdot.force_matrix_unit("")


def exact(q, k, v, causal=False):
    """Attention in float64 of [B, H, L, E] arrays (H == Hkv), with W."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None] + S - L, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w @ np.abs(v)


def bf16_inputs(shape=(1, 2, 70, 64), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(ml_dtypes.bfloat16) for _ in range(3)]


def units():
    return softdot.matrix_units()


def test_units_listed_and_forced():
    us = units()
    assert us[-1] == "none"
    assert softdot.matrix_unit() in us
    assert softdot.matrix_unit() != "model"  # never chosen by itself
    softdot.force_matrix_unit("none")
    assert softdot.matrix_unit() == "none"
    with pytest.raises(ValueError, match="is not a matrix unit"):
        softdot.force_matrix_unit("tpu")
    softdot.force_matrix_unit("")


@pytest.mark.parametrize("unit", ["avx512bf16", "model", "none"])
@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_numpy_within_bound(unit, causal):
    if unit not in units():
        pytest.skip(f"no {unit} here (units: {units()})")
    softdot.force_matrix_unit(unit)
    q, k, v = bf16_inputs()
    o = softdot.scaled_dot_product_attention(q, k, v, causal=causal)
    assert o.dtype == ml_dtypes.bfloat16 and o.shape == q.shape
    want, W = exact(q, k, v, causal)
    got = o.astype(np.float64)
    # Output rounding (2^-8 |O|) + weights rounding (2^-8 W) + the float
    # path's few u_f32 W.
    assert np.all(np.abs(got - want) <= 2 * U_BF16 * W + 1e-6 * W)
    # float32 output: no output rounding; split brings the weights to 2^-16.
    o32 = np.empty(q.shape, np.float32)
    softdot.scaled_dot_product_attention(q, k, v, causal=causal, out=o32, unit_weights="split")
    err = np.max(np.abs(o32 - want) / W)
    assert err <= 2.0**-16 + 1e-5, err
    o32r = np.empty(q.shape, np.float32)
    softdot.scaled_dot_product_attention(q, k, v, causal=causal, out=o32r)
    err_r = np.max(np.abs(o32r - want) / W)
    assert err_r <= 2.0**-8 + 1e-5, err_r
    if unit != "none":
        # The units round P: measurably less accurate than split (the
        # float32 path keeps P in float either way).
        assert err < err_r / 16


def test_model_gives_the_hardware_bits():
    if "avx512bf16" not in units():
        pytest.skip("no AVX512-BF16 here")
    q, k, v = bf16_inputs((2, 4, 100, 32), seed=3)
    outs = []
    for unit in ("avx512bf16", "model"):
        softdot.force_matrix_unit(unit)
        for w in ("rounded", "split"):
            outs.append(
                softdot.scaled_dot_product_attention(q, k, v, causal=True, unit_weights=w)
                .view(np.uint16)
                .copy()
            )
    assert np.array_equal(outs[0], outs[2]) and np.array_equal(outs[1], outs[3])
    assert not np.array_equal(outs[0], outs[1])  # split differs from rounded


def test_torch_bfloat16_and_float16_match_numpy():
    q, k, v = bf16_inputs((1, 4, 40, 32), seed=1)
    tq, tk, tv = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (q, k, v))
    o = softdot.scaled_dot_product_attention(tq, tk, tv, causal=True)
    assert o.dtype == torch.bfloat16 and tuple(o.shape) == q.shape
    on = softdot.scaled_dot_product_attention(q, k, v, causal=True)
    assert np.array_equal(o.view(torch.int16).numpy(), on.view(np.int16))
    # torch's own bfloat16 SDPA agrees within both results' roundings.
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    assert torch.max(torch.abs(ref.float() - o.float())) < 0.05
    # float16, torch and numpy.
    h = [x.astype(np.float32).astype(np.float16) for x in (q, k, v)]
    th = [torch.from_numpy(x) for x in h]
    oh = softdot.scaled_dot_product_attention(*th)
    assert oh.dtype == torch.float16
    onh = softdot.scaled_dot_product_attention(*h)
    assert onh.dtype == np.float16 and np.array_equal(oh.numpy(), onh)
    want, W = exact(*h)
    assert np.all(np.abs(onh.astype(np.float64) - want) <= U_F16 * np.abs(want) + 1e-6 * W)


def test_out_and_lse():
    q, k, v = bf16_inputs((1, 2, 33, 16), seed=2)
    out = np.full(q.shape, 7, dtype=ml_dtypes.bfloat16)
    o, lse = softdot.scaled_dot_product_attention(q, k, v, out=out, return_lse=True)
    assert o is out and lse.dtype == np.float32 and lse.shape == q.shape[:-1]
    o2 = softdot.scaled_dot_product_attention(q, k, v)
    assert np.array_equal(out.view(np.uint16), o2.view(np.uint16))
    with pytest.raises(TypeError, match="expected bfloat16 .the query's. or float32"):
        softdot.scaled_dot_product_attention(q, k, v, out=np.empty(q.shape, np.float16))
    with pytest.raises(TypeError, match="weights take a float32 query"):
        softdot.attention_weights(q, k)
    with pytest.raises(ValueError, match="unit_weights must be 'rounded' or 'split'"):
        softdot.scaled_dot_product_attention(q, k, v, unit_weights="exact")


def test_paged_bfloat16_query():
    q, k, v = bf16_inputs((1, 2, 20, 16), seed=4)
    # One sequence of 20 keys in pages of 8 (NHD: [P, page, Hkv, E]).
    P = 3
    kp = np.zeros((P, 8, 2, 16), ml_dtypes.bfloat16)
    vp = np.zeros((P, 8, 2, 16), ml_dtypes.bfloat16)
    table = np.array([[2, 0, 1]], np.int32)
    for j in range(20):
        kp[table[0, j // 8], j % 8] = k[0, :, j]
        vp[table[0, j // 8], j % 8] = v[0, :, j]
    o = softdot.paged_attention(q, kp, vp, table, np.array([20], np.int32), causal=True)
    want = softdot.scaled_dot_product_attention(q, k, v, causal=True)
    assert o.dtype == ml_dtypes.bfloat16
    assert np.array_equal(o.view(np.uint16), want.view(np.uint16))


def test_threads_same_bits():
    import subprocess
    import sys

    code = (
        "import numpy as np, ml_dtypes, softdot;"
        "r=np.random.default_rng(9);"
        "q,k,v=[r.standard_normal((1,4,130,64)).astype(ml_dtypes.bfloat16) for _ in range(3)];"
        "print(softdot.scaled_dot_product_attention(q,k,v,causal=True).view(np.uint16).sum("
        "dtype=np.uint64), softdot.matrix_unit())"
    )
    outs = set()
    for th in ("1", "2"):
        env = {"OMP_NUM_THREADS": th, "PATH": "/usr/bin:/bin"}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) == 1, outs
    env = {"SOFTDOT_MATRIX_UNIT": "bogus", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "SOFTDOT_MATRIX_UNIT" in r.stderr
