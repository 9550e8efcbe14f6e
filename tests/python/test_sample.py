"""softdot.sample and softdot.speculative_accept from Python: numpy and torch
in and out, 16-bit inputs (torch and ml_dtypes) equal to their float32
widening, seeds per row independent of the batch, greedy, the xgrammar
bitmask (torch int32, as xgrammar allocates it), logprobs against a float64
sort-based reference, a chi-square of draws, the errors, and speculative
acceptance. The C++ tests (tests/unit/sample_test.cc) hold the millions of
draws and the exhaustive option grid."""

import ml_dtypes
import numpy as np
import pytest
import scipy.stats
import torch

import softdot


def reference_probs(x, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """HF's order with ties kept, in float64 by sorting (small rows only)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(-x, kind="stable")
    keep = np.isfinite(x) | (x == np.inf)
    if top_k and top_k < keep.sum():
        keep &= x >= x[order[top_k - 1]]
    e = np.where(keep, np.exp((x - x.max()) / temperature), 0.0)
    if top_p < 1:
        cum = np.cumsum(e[order] / e.sum())
        cut = e[order][np.argmax(cum >= top_p)]
        e = np.where(e >= cut, e, 0.0)
    e = np.where(e >= min_p, e, 0.0)
    return e / e.sum()


def test_numpy_and_torch_give_the_same_tokens(rng):
    x = (rng.standard_normal((5, 300)) * 2).astype(np.float32)
    seeds = [11, 12, 13, 14, 15]
    a = softdot.sample(x, seed=seeds, top_k=40, top_p=0.9)
    b = softdot.sample(torch.from_numpy(x), seed=seeds, top_k=40, top_p=0.9)
    assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == (5,)
    assert isinstance(b, torch.Tensor) and b.dtype == torch.int64
    np.testing.assert_array_equal(a, b.numpy())
    # One row in, a 0-d result; its token is the batch's row 2 token.
    one = softdot.sample(x[2], seed=13, top_k=40, top_p=0.9)
    assert one.shape == () and int(one) == a[2]
    # Strided rows (every other row of a bigger array) are read in place.
    big = np.repeat(x, 2, axis=0)
    np.testing.assert_array_equal(softdot.sample(big[::2], seed=seeds, top_k=40, top_p=0.9), a)


def test_sixteen_bit_inputs_equal_their_widening(rng):
    x = (rng.standard_normal((4, 200)) * 3).astype(np.float32)
    seeds = [1, 2, 3, 4]
    tb = torch.from_numpy(x).bfloat16()
    want = softdot.sample(tb.float(), seed=seeds, temperature=0.7, return_logprobs=True)
    got = softdot.sample(tb, seed=seeds, temperature=0.7, return_logprobs=True)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    mb = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        softdot.sample(mb, seed=seeds), softdot.sample(mb.astype(np.float32), seed=seeds)
    )
    h = x.astype(np.float16)
    np.testing.assert_array_equal(
        softdot.sample(h, seed=seeds), softdot.sample(h.astype(np.float32), seed=seeds)
    )


def test_a_rows_token_depends_only_on_its_seed_and_logits(rng):
    x = (rng.standard_normal((64, 4000)) * 2).astype(np.float32)
    seeds = np.arange(64, dtype=np.uint64) * 7919 + 5
    batch = softdot.sample(x, seed=seeds, top_p=0.95, min_p=0.01)
    alone = [
        int(softdot.sample(x[i], seed=int(seeds[i]), top_p=0.95, min_p=0.01)) for i in range(64)
    ]
    np.testing.assert_array_equal(batch, alone)
    perm = rng.permutation(64)
    np.testing.assert_array_equal(
        softdot.sample(x[perm], seed=seeds[perm], top_p=0.95, min_p=0.01), batch[perm]
    )
    # Another seed gives other tokens (the seed is used).
    assert (softdot.sample(x, seed=seeds + 1, top_p=0.95, min_p=0.01) != batch).any()


def test_greedy_is_the_first_argmax():
    x = np.array([[1, 7, 3, 7], [0, -1, 5, 5]], dtype=np.float32)
    tok, lp = softdot.sample(x, temperature=0, seed=0, return_logprobs=True)
    np.testing.assert_array_equal(tok, [1, 2])
    np.testing.assert_array_equal(lp, [0, 0])


def test_bitmask_in_xgrammars_format(rng):
    vocab = 100
    x = torch.from_numpy((rng.standard_normal((3, vocab)) * 2).astype(np.float32))
    words = (vocab + 31) // 32
    mask = torch.zeros((3, words), dtype=torch.int32)  # xgrammar's allocation
    allowed = [[3, 40], [99], [31, 32, 64]]
    for r, toks in enumerate(allowed):
        for t in toks:
            word = int(mask[r, t // 32]) & 0xFFFFFFFF | (1 << (t % 32))
            mask[r, t // 32] = word - (1 << 32) if word >= 1 << 31 else word
    for s in range(30):
        tok = softdot.sample(x, seed=[s, s + 100, s + 200], bitmask=mask)
        for r in range(3):
            assert int(tok[r]) in allowed[r]
    # Greedy under the mask: the allowed argmax.
    tok = softdot.sample(x, seed=0, temperature=0, bitmask=mask)
    for r in range(3):
        assert int(tok[r]) == max(allowed[r], key=lambda t: float(x[r, t]))
    # One mask row shared by every row; uint32 is accepted too.
    shared = mask[0].numpy().view(np.uint32)
    tok = softdot.sample(x.numpy(), seed=[1, 2, 3], bitmask=shared)
    assert set(tok.tolist()) <= {3, 40}


@pytest.mark.parametrize(
    "opts",
    [
        dict(),
        dict(temperature=0.6, top_k=5),
        dict(top_p=0.7),
        dict(temperature=1.3, top_k=12, top_p=0.8, min_p=0.05),
        dict(min_p=0.2),
    ],
)
def test_logprobs_and_the_kept_set_against_the_reference(rng, opts):
    x = (rng.standard_normal(30) * 2).astype(np.float32)
    p = reference_probs(x, **opts)
    seeds = np.arange(2000, dtype=np.uint64)
    tok, lp = softdot.sample(
        np.broadcast_to(x, (2000, 30)), seed=seeds, return_logprobs=True, **opts
    )
    assert (p[tok] > 0).all(), "a token outside the kept set"
    np.testing.assert_allclose(lp, np.log(p[tok]), rtol=2e-6, atol=3e-7)
    # Chi-square over the kept tokens (2000 draws of 30 rows: a light check;
    # the C++ test draws millions).
    kept = np.flatnonzero(p)
    if len(kept) > 1:
        counts = np.bincount(tok, minlength=30)[kept]
        assert scipy.stats.chisquare(counts, p[kept] * 2000).pvalue > 1e-6


def test_infinite_logits_are_uniform_and_errors():
    x = np.array([0, np.inf, 1, np.inf], dtype=np.float32)
    tok, lp = softdot.sample(
        np.broadcast_to(x, (400, 4)), seed=np.arange(400), return_logprobs=True
    )
    assert set(tok.tolist()) == {1, 3}
    np.testing.assert_allclose(lp, -np.log(2), rtol=1e-7)
    bad = np.array([[0, 1], [np.nan, 1]], dtype=np.float32)
    with pytest.raises(ValueError, match="row 1 has a NaN"):
        softdot.sample(bad, seed=0)
    with pytest.raises(ValueError, match="row 0 has no allowed token"):
        softdot.sample(np.full((1, 3), -np.inf, np.float32), seed=0)
    ok = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="temperature"):
        softdot.sample(ok, seed=0, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        softdot.sample(ok, seed=0, top_p=0)
    with pytest.raises(ValueError, match="min_p"):
        softdot.sample(ok, seed=0, min_p=2)
    with pytest.raises(ValueError, match="top_k"):
        softdot.sample(ok, seed=0, top_k=-1)
    with pytest.raises(ValueError, match="seed"):
        softdot.sample(ok, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="seed"):
        softdot.sample(ok, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        softdot.sample(ok, seed=1.5)
    with pytest.raises(TypeError, match="float64"):
        softdot.sample(ok.astype(np.float64), seed=0)
    with pytest.raises(ValueError, match="bitmask"):
        softdot.sample(ok, seed=0, bitmask=np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="bitmask"):
        softdot.sample(ok, seed=0, bitmask=np.zeros(1, np.int64))


def test_speculative_accept():
    # Greedy target: accept while the draft is the argmax, then the argmax.
    target = torch.tensor([[[0.0, 3, 1], [5, 2, 0], [0, 0, 9]]])  # B=1, K=2
    acc, tok = softdot.speculative_accept(
        torch.tensor([[1, 1]]), None, target, seed=0, temperature=0
    )
    assert acc.tolist() == [1] and tok.tolist() == [[1, 0, -1]]
    acc, tok = softdot.speculative_accept(
        torch.tensor([[1, 0]]), None, target, seed=0, temperature=0
    )
    assert acc.tolist() == [2] and tok.tolist() == [[1, 0, 2]]
    # Sampled target: the first token follows the target's distribution.
    rng = np.random.default_rng(4)
    v, b = 6, 20000
    tl = rng.standard_normal((1, 2, v)).astype(np.float32)
    dp = np.full((b, 1, v), 1.0 / v, dtype=np.float32)
    drafts = rng.integers(0, v, size=(b, 1))
    acc, tok = softdot.speculative_accept(
        drafts, dp, np.broadcast_to(tl, (b, 2, v)), seed=np.arange(b)
    )
    q = reference_probs(tl[0, 0])
    counts = np.bincount(tok[:, 0], minlength=v)
    assert scipy.stats.chisquare(counts, q * b).pvalue > 1e-6
    assert ((acc == 1) == (tok[:, 1] >= 0)).all()
    with pytest.raises(ValueError, match="target_logits"):
        softdot.speculative_accept(drafts, dp, tl, seed=0)
    with pytest.raises(ValueError, match="draft token 7"):
        softdot.speculative_accept([[7]], None, tl, seed=0)
