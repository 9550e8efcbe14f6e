"""The serving engines' calls: paged_attention on a ragged batch (the packed
query [T, Hq, E] with query_start_loc) bit for bit against each sequence
alone and against torch SDPA, for numpy and torch, every cache dtype; and
write_kv (vLLM's reshape_and_cache) into every cache dtype, read back by
paged_attention, with its errors (nothing written)."""

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_paged import bottom_right, make_cache

import softdot

BF16 = ml_dtypes.bfloat16

LENS = [700, 1, 1100, 65, 0, 300, 40]
# Rows per sequence: decode (1), a one-key sequence's one row, a prefill
# chunk, sequences with no rows (one of them with no keys), verification
# rows. A sequence never has more rows than keys (its rows are its newest
# tokens): test_errors.py::test_ragged_sequence_with_more_rows_than_keys_is_an_error.
NQS = [1, 1, 70, 0, 0, 17, 2]


def packed(rng, nqs, Hq, E, dtype=np.float32):
    qsl = np.concatenate([[0], np.cumsum(nqs)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), Hq, E)).astype(np.float32).astype(dtype)
    return q, qsl


def int8_cache(kc, vc):
    """(values, scales) pairs quantising every row of a float32 NHD cache
    (NaN rows of unused slots become zeros)."""

    def quant(c):
        x = np.nan_to_num(c.astype(np.float32))
        vals, sc = softdot.quantize_kv(x.reshape(-1, x.shape[-1]))
        return vals.reshape(c.shape), sc.reshape(c.shape[:-1])

    return quant(kc), quant(vc)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_equals_each_sequence_alone(dtype, causal):
    rng = np.random.default_rng(3 + causal)
    Hq, Hkv, E = 8, 2, 32
    cdt = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16, "int8": np.float32}
    _, _, kc, vc, table, lens = make_cache(rng, LENS, 16, Hkv, E, E, dtype=cdt[dtype])
    if dtype == "int8":
        kc, vc = int8_cache(kc, vc)
    q, qsl = packed(rng, NQS, Hq, E)
    out, lse = softdot.paged_attention(
        q, kc, vc, table, lens, causal=causal, query_start_loc=qsl, return_lse=True
    )
    assert out.shape == (q.shape[0], Hq, E) and out.dtype == np.float32
    assert lse.shape == (Hq, q.shape[0])
    for b, n in enumerate(NQS):
        if n == 0:
            continue
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        qb = np.ascontiguousarray(q[r].transpose(1, 0, 2))[None]
        ob, lb = softdot.paged_attention(
            qb, kc, vc, table[b : b + 1], lens[b : b + 1], causal=causal, return_lse=True
        )
        np.testing.assert_array_equal(out[r].transpose(1, 0, 2), ob[0])
        np.testing.assert_array_equal(lse[:, r], lb[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_batch_invariant_token_bits(dtype):
    """batch_invariant: each token's bits in a ragged batch (prefill chunks,
    decode rows, a 4-token verification block; bfloat16 queries on bfloat16
    pages too) equal the token decoded alone; by default a prefill row's do
    not."""
    rng = np.random.default_rng(26)
    Hq, Hkv, E = 8, 2, 64
    cdt = {"float32": np.float32, "bfloat16": BF16, "int8": np.float32}
    lens = [1100, 700, 40, 600]
    nqs = [37, 1, 4, 9]
    _, _, kc, vc, table, sl = make_cache(rng, lens, 16, Hkv, E, E, dtype=cdt[dtype])
    if dtype == "int8":
        kc, vc = int8_cache(kc, vc)
    q, qsl = packed(rng, nqs, Hq, E, BF16 if dtype == "bfloat16" else np.float32)
    kw = dict(causal=True, sinks=np.linspace(-1, 1, Hq, dtype=np.float32), window=(500, 0))
    out, lse = softdot.paged_attention(
        q, kc, vc, table, sl, query_start_loc=qsl, return_lse=True, batch_invariant=True, **kw
    )
    default = softdot.paged_attention(q, kc, vc, table, sl, query_start_loc=qsl, **kw)
    differs = False
    for b, n in enumerate(nqs):
        for i in range(n):
            t = int(qsl[b]) + i
            ob, lb = softdot.paged_attention(
                q[t : t + 1],
                kc,
                vc,
                table[b : b + 1],
                np.array([lens[b] - n + i + 1], np.int32),
                query_start_loc=np.array([0, 1], np.int32),
                return_lse=True,
                batch_invariant=True,
                **kw,
            )
            np.testing.assert_array_equal(out[t].view(np.uint8), ob[0].view(np.uint8))
            np.testing.assert_array_equal(lse[:, t], lb[:, 0])
            differs |= not np.array_equal(default[t].view(np.uint8), ob[0].view(np.uint8))
    assert differs  # the default's prefill rows round their scores otherwise
    with pytest.raises(ValueError, match="batch_invariant cannot be combined with precise"):
        softdot.scaled_dot_product_attention(
            np.zeros((1, 1, 2, 4), np.float32),
            np.zeros((1, 1, 2, 4), np.float32),
            np.zeros((1, 1, 2, 4), np.float32),
            precise=True,
            batch_invariant=True,
        )


def test_draft_tree_equals_its_dense_mask_and_torch():
    """A ragged batch of draft trees (parents per row): each sequence equals
    the call on it alone with the dense mask the tree stands for, bit for
    bit, and torch SDPA with that mask within float32 rounding; a bad
    parent is a clear error."""
    rng = np.random.default_rng(7)
    Hq, Hkv, E = 8, 2, 32
    lens, nqs = [300, 40, 700], [6, 5, 9]
    ks, vs, kc, vc, table, sl = make_cache(rng, lens, 16, Hkv, E, E)
    q, qsl = packed(rng, nqs, Hq, E)
    par = np.concatenate([[rng.integers(-1, i) for i in range(n)] for n in nqs]).astype(np.int32)
    out = softdot.paged_attention(
        q, kc, vc, table, sl, causal=True, query_start_loc=qsl, draft_parents=par
    )
    for b, n in enumerate(nqs):
        L = lens[b]
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        mask = np.zeros((n, L), bool)
        mask[:, : L - n] = True
        for i in range(n):
            a = i
            while a >= 0:
                mask[i, L - n + a] = True
                a = int(par[int(qsl[b]) + a])
        qb = np.ascontiguousarray(q[r].transpose(1, 0, 2))[None]
        ob = softdot.paged_attention(
            qb, kc, vc, table[b : b + 1], sl[b : b + 1], causal=True, attn_mask=mask
        )
        np.testing.assert_array_equal(out[r].transpose(1, 0, 2), ob[0])
        want = F.scaled_dot_product_attention(
            torch.from_numpy(qb).double(),
            torch.from_numpy(ks[b][None]).double(),
            torch.from_numpy(vs[b][None]).double(),
            attn_mask=torch.from_numpy(mask),
            enable_gqa=True,
        )
        np.testing.assert_allclose(out[r].transpose(1, 0, 2), want[0].numpy(), atol=2e-6)
    bad = par.copy()
    bad[1] = 1
    with pytest.raises(ValueError, match=r"draft_parents\[1\] = 1 must be -1 or a row before it"):
        softdot.paged_attention(q, kc, vc, table, sl, query_start_loc=qsl, draft_parents=bad)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_alibi_slopes_equal_their_bias_and_torch(dtype):
    """alibi_slopes: bit for bit the bias slope (pos_j - pos_i) rounded once to
    float32 (contiguous prefill and decode, bfloat16 queries on the units,
    a paged cache), a ragged batch equals each sequence alone, and torch
    SDPA with that bias agrees within float32 rounding."""
    rng = np.random.default_rng(11)
    Hq, Hkv, E = 8, 2, 32
    slopes = (2.0 ** -np.arange(1, Hq + 1)).astype(np.float32)
    dt = BF16 if dtype == "bfloat16" else np.float32
    for L, S in [(1, 700), (4, 700), (40, 300)]:
        q = rng.standard_normal((1, Hq, L, E)).astype(np.float32).astype(dt)
        k = rng.standard_normal((1, Hkv, S, E)).astype(np.float32).astype(dt)
        v = rng.standard_normal((1, Hkv, S, E)).astype(np.float32).astype(dt)
        dist = np.arange(S)[None, :] - (S - L + np.arange(L))[:, None]
        bias = (slopes.astype(np.float64)[:, None, None] * dist).astype(np.float32)[None]
        a = softdot.scaled_dot_product_attention(q, k, v, causal=True, alibi_slopes=slopes)
        b = softdot.scaled_dot_product_attention(q, k, v, causal=True, bias=bias)
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        if dtype == "float32":
            want = F.scaled_dot_product_attention(
                torch.from_numpy(q).double(),
                torch.from_numpy(k).double(),
                torch.from_numpy(v).double(),
                attn_mask=torch.from_numpy(bias)
                .double()
                .masked_fill(torch.ones(L, S, dtype=torch.bool).tril(S - L).logical_not(), -1e300),
                enable_gqa=True,
            )
            np.testing.assert_allclose(a, want.numpy(), atol=2e-6)
    # Paged, ragged: each sequence alone, and alone with the bias.
    lens, nqs = [700, 40, 300], [1, 5, 17]
    _, _, kc, vc, table, sl = make_cache(rng, lens, 16, Hkv, E, E)
    qr, qsl = packed(rng, nqs, Hq, E)
    out = softdot.paged_attention(
        qr, kc, vc, table, sl, causal=True, query_start_loc=qsl, alibi_slopes=slopes
    )
    for b, n in enumerate(nqs):
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        qb = np.ascontiguousarray(qr[r].transpose(1, 0, 2))[None]
        S = lens[b]
        dist = np.arange(S)[None, :] - (S - n + np.arange(n))[:, None]
        bias = (slopes.astype(np.float64)[:, None, None] * dist).astype(np.float32)[None]
        ob = softdot.paged_attention(
            qb, kc, vc, table[b : b + 1], sl[b : b + 1], causal=True, bias=bias
        )
        np.testing.assert_array_equal(out[r].transpose(1, 0, 2), ob[0])
    if dtype == "float32":  # a slope that requires grad: no silent missing gradient
        st = torch.tensor(slopes, requires_grad=True)
        t = torch.from_numpy(qr[None].transpose(0, 2, 1, 3).copy())
        with pytest.raises(NotImplementedError, match="requires grad"):
            softdot.scaled_dot_product_attention(t, t, t, alibi_slopes=st)
        with pytest.raises(NotImplementedError, match="requires grad"):
            softdot.paged_attention(
                torch.from_numpy(qr), kc, vc, table, sl, query_start_loc=qsl, alibi_slopes=st
            )
    with pytest.raises(ValueError, match="alibi_slopes has 3 values"):
        softdot.paged_attention(qr, kc, vc, table, sl, query_start_loc=qsl, alibi_slopes=slopes[:3])


def test_ragged_against_torch_sdpa():
    rng = np.random.default_rng(8)
    Hq, Hkv, E = 8, 2, 32
    ks, vs, kc, vc, table, lens = make_cache(rng, LENS, 16, Hkv, E, E)
    q, qsl = packed(rng, NQS, Hq, E)
    out = softdot.paged_attention(q, kc, vc, table, lens, causal=True, query_start_loc=qsl)
    for b, n in enumerate(NQS):
        if n == 0 or LENS[b] == 0:
            continue
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        qt = torch.from_numpy(np.ascontiguousarray(q[r].transpose(1, 0, 2)))[None].double()
        k = torch.from_numpy(ks[b])[None].double()
        v = torch.from_numpy(vs[b])[None].double()
        mask = bottom_right(n, LENS[b])
        want = F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, enable_gqa=True)[0]
        seen = mask.any(dim=1).numpy()  # rows with no visible key are zeros
        got = out[r].transpose(1, 0, 2)
        np.testing.assert_allclose(got[:, seen], want.numpy()[:, seen], rtol=1e-5, atol=1e-6)
        assert not got[:, ~seen].any()


def test_ragged_torch_bfloat16_no_copy():
    """torch bfloat16 packed query and cache: the output is bfloat16
    [T, Hq, E], equal to each sequence alone."""
    rng = np.random.default_rng(9)
    Hq, Hkv, E = 8, 2, 64
    _, _, kc, vc, table, lens = make_cache(rng, LENS, 16, Hkv, E, E, dtype=BF16)
    q, qsl = packed(rng, NQS, Hq, E, dtype=BF16)
    kt = torch.from_numpy(kc.view(np.uint16)).view(torch.bfloat16)
    vt = torch.from_numpy(vc.view(np.uint16)).view(torch.bfloat16)
    qt = torch.from_numpy(q.view(np.uint16)).view(torch.bfloat16)
    out = softdot.paged_attention(
        qt,
        kt,
        vt,
        torch.from_numpy(table),
        torch.from_numpy(lens),
        causal=True,
        query_start_loc=torch.from_numpy(qsl),
    )
    assert out.dtype == torch.bfloat16 and out.shape == (q.shape[0], Hq, E)
    for b, n in enumerate(NQS):
        if n == 0:
            continue
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        ob = softdot.paged_attention(
            qt[r].transpose(0, 1)[None],
            kt,
            vt,
            torch.from_numpy(table[b : b + 1]),
            torch.from_numpy(lens[b : b + 1]),
            causal=True,
        )
        assert torch.equal(out[r].transpose(0, 1).view(torch.int16), ob[0].view(torch.int16))


def test_ragged_errors():
    rng = np.random.default_rng(1)
    _, _, kc, vc, table, lens = make_cache(rng, [5, 9], 4, 2, 8, 8)
    q, qsl = packed(rng, [2, 3], 4, 8)
    with pytest.raises(ValueError, match=r"query_start_loc\[2\] = 4 must equal the 5 rows"):
        softdot.paged_attention(
            q, kc, vc, table, lens, query_start_loc=np.array([0, 2, 4], np.int32)
        )
    with pytest.raises(ValueError, match="must be 0"):
        softdot.paged_attention(
            q, kc, vc, table, lens, query_start_loc=np.array([1, 2, 5], np.int32)
        )
    with pytest.raises(ValueError, match="expected \\[T, Hq, E\\]"):
        softdot.paged_attention(q[None], kc, vc, table, lens, query_start_loc=qsl)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        softdot.paged_attention(
            q, kc, vc, table, lens, query_start_loc=qsl, attn_mask=np.ones((5, 9), bool)
        )
    with pytest.raises(ValueError, match="claims rows the empty query"):
        softdot.paged_attention(q[:0], kc, vc, table, lens, query_start_loc=qsl)
    out = softdot.paged_attention(q[:0], kc, vc, table, lens, query_start_loc=np.zeros(3, np.int32))
    assert out.shape == (0, 4, 8)
    with pytest.raises(ValueError, match="B \\+ 1"):
        softdot.paged_attention(q, kc, vc, table, lens, query_start_loc=qsl[:2])


@pytest.mark.parametrize("cache_dtype", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_write_kv_then_attend(cache_dtype, layout):
    """A cache filled by write_kv a few tokens per step (pages in a random
    order) attends as the contiguous keys do (int8: as quantize_kv's)."""
    rng = np.random.default_rng(5)
    Hq, Hkv, E, ps = 4, 2, 16, 8
    lens = [37, 5, 70]
    bps = 10
    P = len(lens) * bps + 2
    table = rng.permutation(P)[: len(lens) * bps].reshape(len(lens), bps).astype(np.int32)
    keys = [rng.standard_normal((n, Hkv, E)).astype(np.float32) for n in lens]
    vals = [rng.standard_normal((n, Hkv, E)).astype(np.float32) for n in lens]
    shape = (P, ps, Hkv, E) if layout == "NHD" else (P, Hkv, ps, E)
    if cache_dtype == "int8":
        kc = (np.zeros(shape, np.int8), np.zeros(shape[:-1], np.float32))
        vc = (np.zeros(shape, np.int8), np.zeros(shape[:-1], np.float32))
    else:
        dt = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16}[cache_dtype]
        kc, vc = np.zeros(shape, dt), np.zeros(shape, dt)
    done = [0] * len(lens)
    while any(d < n for d, n in zip(done, lens)):
        slots, kr, vr = [], [], []
        for b, n in enumerate(lens):
            step = min(n - done[b], int(rng.integers(1, 10)))
            for j in range(done[b], done[b] + step):
                slots.append(int(table[b, j // ps]) * ps + j % ps)
                kr.append(keys[b][j])
                vr.append(vals[b][j])
            done[b] += step
        slots.append(-1)  # padding
        kr.append(np.full((Hkv, E), np.nan, np.float32))
        vr.append(np.full((Hkv, E), np.nan, np.float32))
        softdot.write_kv(np.stack(kr), np.stack(vr), kc, vc, np.array(slots), kv_layout=layout)
    q = rng.standard_normal((len(lens), Hq, 3, E)).astype(np.float32)
    got = softdot.paged_attention(
        q, kc, vc, table, np.array(lens, np.int32), causal=True, kv_layout=layout
    )
    for b in range(len(lens)):
        k = keys[b].transpose(1, 0, 2)[None]
        v = vals[b].transpose(1, 0, 2)[None]
        if cache_dtype == "int8":
            k = softdot.quantize_kv(np.ascontiguousarray(k))
            v = softdot.quantize_kv(np.ascontiguousarray(v))
        elif cache_dtype != "float32":
            dt = {"float16": np.float16, "bfloat16": BF16}[cache_dtype]
            k, v = k.astype(dt), v.astype(dt)
        want = softdot.scaled_dot_product_attention(q[b : b + 1], k, v, causal=True)
        np.testing.assert_array_equal(got[b : b + 1], want)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "int8"])
def test_write_and_attend_in_one_call(cache_dtype):
    """kv_write: the same bits as write_kv then paged_attention, and a call
    whose attention fails (a bad table) leaves the cache as it was, bit for
    bit; a bad slot raises before anything is written."""
    rng = np.random.default_rng(8)
    Hq, Hkv, E, ps, P = 4, 2, 16, 8, 12
    shape = (P, ps, Hkv, E)

    def base():
        if cache_dtype == "int8":
            return (
                rng.integers(-100, 100, shape).astype(np.int8),
                rng.uniform(0.01, 0.02, shape[:-1]).astype(np.float32),
            )
        dt = BF16 if cache_dtype == "bfloat16" else np.float32
        return rng.standard_normal(shape).astype(np.float32).astype(dt)

    kc0, vc0 = base(), base()

    def copy(c):
        return tuple(x.copy() for x in c) if isinstance(c, tuple) else c.copy()

    table = np.array([[3, 7, 1], [0, 5, -1]], np.int32)
    lens = np.array([20, 12], np.int32)
    qsl = np.array([0, 2, 3], np.int32)
    q = rng.standard_normal((3, Hq, E)).astype(np.float32)
    key = rng.standard_normal((3, Hkv, E)).astype(np.float32)
    value = rng.standard_normal((3, Hkv, E)).astype(np.float32)
    slots = np.array([7 * ps + 2, 7 * ps + 3, 5 * ps + 3])  # the new tokens' slots
    kc, vc = copy(kc0), copy(vc0)
    softdot.write_kv(key, value, kc, vc, slots)
    want = softdot.paged_attention(q, kc, vc, table, lens, causal=True, query_start_loc=qsl)
    kc, vc = copy(kc0), copy(vc0)
    got = softdot.paged_attention(
        q, kc, vc, table, lens, causal=True, query_start_loc=qsl, kv_write=(key, value, slots)
    )
    np.testing.assert_array_equal(got, want)

    def same(a, b):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))

    kc, vc = copy(kc0), copy(vc0)
    bad_table = table.copy()
    bad_table[1, 0] = P  # not a page: the attention raises after the write
    with pytest.raises(ValueError, match="block_table"):
        softdot.paged_attention(
            q,
            kc,
            vc,
            bad_table,
            lens,
            causal=True,
            query_start_loc=qsl,
            kv_write=(key, value, slots),
        )
    same(kc, kc0)
    same(vc, vc0)
    with pytest.raises(ValueError, match="written twice"):
        softdot.paged_attention(
            q,
            kc,
            vc,
            table,
            lens,
            causal=True,
            query_start_loc=qsl,
            kv_write=(key, value, np.array([3, 3, 4])),
        )
    same(kc, kc0)
    same(vc, vc0)


def test_write_kv_torch_in_place():
    Hkv, E, ps = 2, 8, 4
    kc = torch.zeros((3, ps, Hkv, E), dtype=torch.bfloat16)
    vc = torch.zeros((3, ps, Hkv, E), dtype=torch.bfloat16)
    k = torch.randn(2, Hkv, E, dtype=torch.bfloat16)
    v = torch.randn(2, Hkv, E, dtype=torch.bfloat16)
    softdot.write_kv(k, v, kc, vc, torch.tensor([5, 0]))
    assert torch.equal(kc[1, 1], k[0]) and torch.equal(vc[0, 0], v[1])
    assert not kc[2].any()


def test_write_kv_errors_write_nothing():
    Hkv, E, ps = 2, 4, 3
    kc = np.zeros((2, ps, Hkv, E), np.float32)
    vc = np.zeros((2, ps, Hkv, E), np.float32)
    k = np.ones((3, Hkv, E), np.float32)
    cases = [
        ([0, 6, 1], r"slot_mapping\[1\] = 6 is not a slot"),
        ([0, -2, 1], r"slot_mapping\[1\] = -2 is negative"),
        ([4, 1, 4], r"slot 4 is written twice: by row 0 and row 2"),
        ([0, 1], "slot_mapping has 2 entries"),
    ]
    for slots, msg in cases:
        with pytest.raises(ValueError, match=msg):
            softdot.write_kv(k, k, kc, vc, np.array(slots))
        assert not kc.any() and not vc.any()
    k8 = (np.zeros((2, ps, Hkv, E), np.int8), np.zeros((2, ps, Hkv), np.float32))
    v8 = (np.zeros((2, ps, Hkv, E), np.int8), np.zeros((2, ps, Hkv), np.float32))
    bad = k.copy()
    bad[1, 0, 2] = np.inf
    with pytest.raises(ValueError, match="key holds inf"):
        softdot.write_kv(bad, k, k8, v8, np.array([0, 1, 2]))
    assert not k8[0].any() and not k8[1].any()
    with pytest.raises(ValueError, match="read-only"):
        ro = kc.copy()
        ro.flags.writeable = False
        softdot.write_kv(k, k, ro, vc, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="contiguous last axis"):
        softdot.write_kv(k, k, kc[..., ::2], vc[..., ::2], np.array([0, 1, 2]))


@pytest.mark.parametrize("window", [(-1, -1), (37, 0)])
def test_sharded_positions_merge_to_the_whole_cache(window):
    """Decode context parallelism: rank r of 3 holds the keys at global
    positions 3 c + r; each rank's ragged call with its positions, merged
    with attention_merge, is the attention over the whole cache."""
    rng = np.random.default_rng(12)
    Hq, Hkv, E, R = 4, 2, 16, 3
    lens, nqs = [200, 31, 2], [1, 4, 2]
    ks, vs, kc, vc, table, sl = make_cache(rng, lens, 8, Hkv, E, E)
    q, qsl = packed(rng, nqs, Hq, E)
    want, want_lse = softdot.paged_attention(
        q, kc, vc, table, sl, causal=True, window=window, query_start_loc=qsl, return_lse=True
    )
    merged = None
    for r in range(R):
        shard_k = [k[:, r::R] for k in ks]
        shard_v = [v[:, r::R] for v in vs]
        n = [k.shape[1] for k in shard_k]
        # A cache holding the shard (make_cache's layout: [P, ps, Hkv, E]).
        P = sum((x + 7) // 8 for x in n) + 1
        kcr = np.zeros((P, 8, Hkv, E), np.float32)
        vcr = np.zeros((P, 8, Hkv, E), np.float32)
        tab = np.full((len(lens), max(1, max((x + 7) // 8 for x in n))), -1, np.int32)
        nxt = 0
        for b, x in enumerate(n):
            for i in range((x + 7) // 8):
                tab[b, i] = nxt
                nxt += 1
            for t in range(x):
                kcr[tab[b, t // 8], t % 8] = shard_k[b][:, t]
                vcr[tab[b, t // 8], t % 8] = shard_v[b][:, t]
        out, lse = softdot.paged_attention(
            q,
            kcr,
            vcr,
            tab,
            np.array(n, np.int32),
            causal=True,
            window=window,
            query_start_loc=qsl,
            return_lse=True,
            query_positions=np.array([a - b for a, b in zip(lens, nqs)]),
            kv_position_offsets=np.full(len(lens), r),
            kv_position_stride=R,
        )
        part = (np.ascontiguousarray(out.transpose(1, 0, 2)), lse)
        merged = part if merged is None else softdot.attention_merge(*merged, *part)
    np.testing.assert_allclose(merged[0], want.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(merged[1], want_lse, rtol=1e-6, atol=1e-6)
