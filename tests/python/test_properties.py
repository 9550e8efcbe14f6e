"""Hypothesis property tests (bounded example counts): chunk states merged
in any split equal the whole row (softmax_apply vs softmax, within 1 ulp),
attention over [a, b) merged with [b, c) equals attention over [a, c),
shift invariance of softmax bit for bit, and the faithful / 2-ulp bounds on
arbitrary finite rows."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import softdot

from conftest import (
    FLOATS,
    assert_attention_bound,
    assert_ulp,
    attention_ref,
    logsumexp_ref,
    softmax_ref,
)

# Derandomized (the same examples every run, nothing written to disk).
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)

dtypes = st.sampled_from(FLOATS)


def rows(dtype, min_size=1, max_size=60, lim=60.0):
    """Finite rows with |x| <= lim (the long double reference is exact to
    far below an ulp there), subnormals and repeats included."""
    width = 32 if dtype == np.float32 else 64
    return hnp.arrays(
        dtype,
        st.integers(min_size, max_size),
        elements=st.floats(-lim, lim, width=width, allow_subnormal=True),
    )


@st.composite
def row_and_cuts(draw):
    dtype = draw(dtypes)
    x = draw(rows(dtype, max_size=80))
    cuts = sorted(draw(st.lists(st.integers(0, len(x)), max_size=6)))
    mask = draw(st.one_of(st.none(), hnp.arrays(np.bool_, len(x))))
    return x, cuts, mask


@SETTINGS
@given(row_and_cuts())
def test_merged_chunk_states_equal_whole_row(args):
    x, cuts, mask = args
    dtype = x.dtype.type
    bounds = [0, *cuts, len(x)]
    total = softdot.SoftmaxState.identity(dtype)
    for a, b in zip(bounds[:-1], bounds[1:]):
        w = None if mask is None else mask[a:b]
        total = total.merge(softdot.softmax_state(x[a:b], where=w))
    y = np.concatenate(
        [
            softdot.softmax_apply(x[a:b], total, where=None if mask is None else mask[a:b])
            for a, b in zip(bounds[:-1], bounds[1:])
        ]
    )
    whole = softdot.softmax(x, where=mask)
    if mask is not None and not mask.any():
        assert np.all(y == 0) and np.all(whole == 0)
        return
    assert_ulp(y, whole, 1)
    assert_ulp(y, softmax_ref(x, where=mask), 1)
    assert_ulp(np.asarray(total.logsumexp()), np.asarray(logsumexp_ref(x, where=mask)), 2)


@SETTINGS
@given(dtypes.flatmap(lambda d: rows(d)), st.sampled_from(["faithful", "fast"]))
def test_softmax_bound_on_any_row(x, precision):
    y = softdot.softmax(x, precision=precision)
    assert_ulp(y, softmax_ref(x), 1 if precision == "faithful" else 2)
    assert not np.signbit(y).any()


@SETTINGS
@given(dtypes.flatmap(lambda d: rows(d)))
def test_logsumexp_bound_on_any_row(x):
    assert_ulp(np.asarray(softdot.logsumexp(x)), np.asarray(logsumexp_ref(x)), 2)


@SETTINGS
@given(dtypes, st.data())
def test_shift_invariance_bits(dtype, data):
    """softmax(x + c) has the same bits as softmax(x) when x + c is exact:
    integer-valued x and a power-of-two c well inside the significand."""
    n = data.draw(st.integers(1, 50))
    x = np.array(data.draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)), dtype=dtype)
    k = data.draw(st.integers(-3, 12 if dtype == np.float32 else 40))
    sign = data.draw(st.sampled_from([1, -1]))
    c = dtype(sign * 2.0**k)
    xc = x + c
    assert np.array_equal(xc - c, x)  # the shift is exact
    for p in ("faithful", "fast"):
        np.testing.assert_array_equal(
            softdot.softmax(xc, precision=p), softdot.softmax(x, precision=p)
        )


@st.composite
def attention_case(draw):
    S = draw(st.integers(1, 140))
    a = draw(st.integers(0, S))
    c = draw(st.integers(a, S))
    b = draw(st.integers(a, c))
    L = draw(st.sampled_from([1, 3, 20]))
    Hk = draw(st.sampled_from([1, 2]))
    g = draw(st.sampled_from([1, 2]))
    E = draw(st.sampled_from([4, 16, 33]))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return S, a, b, c, L, Hk, g, E, causal, seed


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(attention_case())
def test_attention_ranges_merge(case):
    S, a, b, c, L, Hk, g, E, causal, seed = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, Hk * g, L, E)).astype(np.float32)
    k = rng.standard_normal((1, Hk, S, E)).astype(np.float32)
    v = (rng.random((1, Hk, S, 5)) + 0.5).astype(np.float32)  # outputs in [0.5, 1.5]
    o1, l1 = softdot.scaled_dot_product_attention(
        q, k, v, causal=causal, return_lse=True, kv_range=(a, b)
    )
    o2, l2 = softdot.scaled_dot_product_attention(
        q, k, v, causal=causal, return_lse=True, kv_range=(b, c)
    )
    om, lm = softdot.attention_merge(o1, l1, o2, l2)
    od, ld = softdot.scaled_dot_product_attention(
        q, k, v, causal=causal, return_lse=True, kv_range=(a, c)
    )
    seen = np.isfinite(ld)
    # Rows that see no key in [a, c) are zeros with lse -inf either way.
    np.testing.assert_array_equal(lm[~seen], ld[~seen])
    assert np.all(om[~seen] == 0) and np.all(od[~seen] == 0)
    # Both are within the stated bound of the exact result.
    ref, _, bound, _, _ = attention_ref(q, k, v, causal=causal, kv_range=(a, c))
    sel = np.broadcast_to(seen[..., None], om.shape)
    assert_attention_bound(np.where(sel, om, 0), np.where(sel, ref, 0), bound)
    assert_attention_bound(np.where(sel, od, 0), np.where(sel, ref, 0), bound)
    # And within a few ulp of each other.
    np.testing.assert_array_max_ulp(om[sel], od[sel], maxulp=8)
    np.testing.assert_array_max_ulp(lm[seen], ld[seen], maxulp=2)
