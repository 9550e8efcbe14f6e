"""paged_attention on numpy arrays and CPU tensors: against
torch.nn.functional.scaled_dot_product_attention on each sequence's cache
gathered in order (GQA with enable_gqa, decode and chunked prefill, causal
bottom-right as a bool mask), bit for bit against softdot's own contiguous
attention (float32, float16, bfloat16, int8 as (values, scales)), both page
layouts, bad tables, and no copy of the caches (zero-copy)."""

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softdot

RTOL, ATOL = 1e-5, 1e-6


def make_cache(rng, lens, page_size, Hkv, E, Ev, layout="NHD", dtype=np.float32, spare=2):
    """Random per-sequence K and V [Hkv, n, E], and the paged cache holding
    them in pages taken in a random order (unused slots NaN)."""
    B = len(lens)
    blocks = [(n + page_size - 1) // page_size for n in lens]
    P = sum(blocks) + spare
    order = rng.permutation(P)
    bps = max(blocks) + 1
    table = np.full((B, bps), -1, dtype=np.int32)
    fill = np.nan if np.dtype(dtype).kind == "f" or dtype == ml_dtypes.bfloat16 else 0
    kc = np.full((P, page_size, Hkv, E), fill, dtype=np.float32).astype(dtype)
    vc = np.full((P, page_size, Hkv, Ev), fill, dtype=np.float32).astype(dtype)
    ks, vs, nxt = [], [], 0
    for b, n in enumerate(lens):
        k = rng.standard_normal((Hkv, n, E)).astype(np.float32).astype(dtype)
        v = rng.standard_normal((Hkv, n, Ev)).astype(np.float32).astype(dtype)
        ks.append(k)
        vs.append(v)
        for i in range(blocks[b]):
            table[b, i] = order[nxt]
            nxt += 1
        for t in range(n):
            pg = table[b, t // page_size]
            kc[pg, t % page_size] = k[:, t]
            vc[pg, t % page_size] = v[:, t]
    if layout == "HND":
        kc = np.ascontiguousarray(kc.transpose(0, 2, 1, 3))
        vc = np.ascontiguousarray(vc.transpose(0, 2, 1, 3))
    return ks, vs, kc, vc, table, np.array(lens, dtype=np.int32)


def bottom_right(L, S):
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)


@pytest.mark.parametrize("L", [1, 37])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_against_torch_sdpa(L, page_size, causal):
    rng = np.random.default_rng(L * 100 + page_size + causal)
    lens = [5, 130, 64, 300] if causal else [0, 130, 64, 300]
    lens = [max(n, L) for n in lens] if causal else lens
    Hq, Hkv, E, Ev = 8, 2, 32, 24
    ks, vs, kc, vc, table, sl = make_cache(rng, lens, page_size, Hkv, E, Ev)
    q = rng.standard_normal((len(lens), Hq, L, E)).astype(np.float32)
    out, lse = softdot.paged_attention(q, kc, vc, table, sl, causal=causal, return_lse=True)
    assert out.shape == (len(lens), Hq, L, Ev) and lse.shape == (len(lens), Hq, L)
    for b, n in enumerate(lens):
        if n == 0:
            assert np.all(out[b] == 0) and np.all(lse[b] == -np.inf)
            continue
        qt = torch.from_numpy(q[b : b + 1])
        kt = torch.from_numpy(ks[b][None])
        vt = torch.from_numpy(vs[b][None])
        mask = bottom_right(L, n) if causal else None
        want = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
        np.testing.assert_allclose(out[b : b + 1], want.numpy(), rtol=RTOL, atol=ATOL)
        # lse against float64.
        kr = np.repeat(ks[b].astype(np.float64), Hq // Hkv, axis=0)
        s = q[b].astype(np.float64) @ kr.transpose(0, 2, 1) / np.sqrt(E)
        if causal:
            s = np.where(bottom_right(L, n).numpy(), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        want_lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
        np.testing.assert_allclose(lse[b], want_lse, rtol=1e-5, atol=1e-5)


KV_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_bitwise_equal_to_contiguous(dtype, layout):
    rng = np.random.default_rng(7)
    lens = [0, 1, 63, 65, 200]
    Hq, Hkv, E, Ev, L = 4, 2, 40, 16, 3
    ks, vs, kc, vc, table, sl = make_cache(rng, lens, 16, Hkv, E, Ev, layout, dtype)
    q = rng.standard_normal((len(lens), Hq, L, E)).astype(np.float32)
    sinks = np.array([0.5, -1.0, 0.0, 2.0], dtype=np.float32)
    kw = dict(causal=True, window=(40, -1), softcap=5.0, sinks=sinks, scale=0.2)
    out, lse = softdot.paged_attention(
        q, kc, vc, table, sl, kv_layout=layout, return_lse=True, **kw
    )
    for b, n in enumerate(lens):
        if n == 0:
            # An empty sequence: zero rows, lse the sink (the sink's share is
            # the whole denominator). (scaled_dot_product_attention itself
            # refuses a key with S = 0, "key's last axis is not contiguous":
            # a separate issue.)
            assert np.all(out[b] == 0) and not np.signbit(out[b]).any()
            assert np.array_equal(lse[b], np.repeat(sinks[:, None], L, axis=1))
            continue
        want, wl = softdot.scaled_dot_product_attention(q[b], ks[b], vs[b], return_lse=True, **kw)
        assert out[b].tobytes() == want.tobytes(), b
        assert lse[b].tobytes() == wl.tobytes(), b


def test_int8_tuple_bitwise_and_torch():
    rng = np.random.default_rng(8)
    lens = [3, 100, 40]
    Hq, Hkv, E, Ev, L, ps = 4, 1, 16, 16, 2, 8
    P = sum((n + ps - 1) // ps for n in lens)
    table = np.full((len(lens), 20), -1, dtype=np.int32)
    kv8 = rng.integers(-127, 128, size=(P, ps, Hkv, E), dtype=np.int8)
    vv8 = rng.integers(-127, 128, size=(P, ps, Hkv, Ev), dtype=np.int8)
    kscale = rng.uniform(0.001, 0.02, size=(P, ps, Hkv)).astype(np.float32)
    vscale = rng.uniform(0.001, 0.02, size=(P, ps, Hkv)).astype(np.float32)
    pages = iter(rng.permutation(P))
    for b, n in enumerate(lens):
        for i in range((n + ps - 1) // ps):
            table[b, i] = next(pages)
    q = rng.standard_normal((len(lens), Hq, L, E)).astype(np.float32)
    out = softdot.paged_attention(q, (kv8, kscale), (vv8, vscale), table, lens, causal=True)
    # The dequantised floats (scale * q rounded once), gathered: float32 paged
    # attention on them gives the same bits.
    kf = kv8.astype(np.float32) * kscale[..., None]
    vf = vv8.astype(np.float32) * vscale[..., None]
    want = softdot.paged_attention(q, kf, vf, table, lens, causal=True)
    assert out.tobytes() == want.tobytes()
    # torch tensors too, scales with a trailing 1.
    tout = softdot.paged_attention(
        torch.from_numpy(q),
        (torch.from_numpy(kv8), torch.from_numpy(kscale[..., None])),
        (torch.from_numpy(vv8), torch.from_numpy(vscale[..., None])),
        torch.from_numpy(table),
        torch.tensor(lens, dtype=torch.int32),
        causal=True,
    )
    assert isinstance(tout, torch.Tensor) and tout.numpy().tobytes() == out.tobytes()


def test_torch_tensors_and_bfloat16():
    rng = np.random.default_rng(9)
    lens = [17, 90]
    ks, vs, kc, vc, table, sl = make_cache(rng, lens, 16, 2, 32, 32)
    q = torch.from_numpy(rng.standard_normal((2, 4, 1, 32)).astype(np.float32))
    kt = torch.from_numpy(kc).to(torch.bfloat16)
    vt = torch.from_numpy(vc).to(torch.bfloat16)
    out = softdot.paged_attention(q, kt, vt, torch.from_numpy(table), torch.from_numpy(sl))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    for b, _n in enumerate(lens):
        kb = torch.from_numpy(ks[b][None]).to(torch.bfloat16).float()
        vb = torch.from_numpy(vs[b][None]).to(torch.bfloat16).float()
        want = F.scaled_dot_product_attention(q[b : b + 1], kb, vb, enable_gqa=True)
        np.testing.assert_allclose(out[b : b + 1].numpy(), want.numpy(), rtol=RTOL, atol=ATOL)


def test_zero_copy_caches(monkeypatch):
    """The caches reach the core as views of the caller's memory."""
    rng = np.random.default_rng(10)
    ks, vs, kc, vc, table, sl = make_cache(rng, [30, 50], 16, 2, 16, 16)
    q = rng.standard_normal((2, 2, 1, 16)).astype(np.float32)
    seen = {}
    real = softdot._request._core.attention_request

    def spy(name, qq, q_format, kv, *rest):
        seen["k"], seen["v"] = kv["k"], kv["v"]
        return real(name, qq, q_format, kv, *rest)

    monkeypatch.setattr(softdot._request._core, "attention_request", spy)
    out = np.empty((2, 2, 1, 16), dtype=np.float32)
    res = softdot.paged_attention(q, kc, vc, table, sl, out=out)
    assert res is out
    assert np.shares_memory(seen["k"], kc) and np.shares_memory(seen["v"], vc)
    kt, vt = torch.from_numpy(kc), torch.from_numpy(vc)
    softdot.paged_attention(
        torch.from_numpy(q), kt, vt, torch.from_numpy(table), torch.from_numpy(sl)
    )
    assert seen["k"].__array_interface__["data"][0] == kt.data_ptr()
    assert seen["v"].__array_interface__["data"][0] == vt.data_ptr()


def test_bad_tables_raise_and_write_nothing():
    rng = np.random.default_rng(11)
    ks, vs, kc, vc, table, sl = make_cache(rng, [10, 20], 8, 1, 8, 8, spare=0)
    q = rng.standard_normal((2, 2, 1, 8)).astype(np.float32)
    P = kc.shape[0]
    out = np.full((2, 2, 1, 8), 7.0, dtype=np.float32)

    def expect(match, t, s):
        with pytest.raises(ValueError, match=match):
            softdot.paged_attention(q, kc, vc, t, s, out=out)
        assert np.all(out == 7.0)

    t = table.copy()
    t[1, 1] = P
    expect(
        r"^paged_attention: block_table\[1, 1\] = %d \(sequence 1, entry 1\) is not a page: "
        r"key_cache has %d pages \(0 to %d\)$" % (P, P, P - 1),
        t,
        sl,
    )
    t[1, 1] = -3
    expect(r"sequence 1, entry 1", t, sl)
    expect(r"seq_lens\[0\] = 40 \(sequence 0\) is longer", table, np.array([40, 20], np.int32))
    expect(r"seq_lens\[1\] = -1", table, np.array([10, -1], np.int32))
    expect(r"block_table has shape", table[:1], sl)
    with pytest.raises(TypeError, match="int32"):
        softdot.paged_attention(q, kc, vc, table.astype(np.float32), sl)
    with pytest.raises(ValueError, match="kv_layout"):
        softdot.paged_attention(q, kc, vc, table, sl, kv_layout="XYZ")
    with pytest.raises(ValueError, match="scales"):
        softdot.paged_attention(
            q,
            (np.zeros(kc.shape, np.int8), np.ones((1, 2), np.float32)),
            (np.zeros(vc.shape, np.int8), np.ones((1, 2), np.float32)),
            table,
            sl,
        )
