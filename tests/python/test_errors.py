"""Bad inputs: every error has its exception type and a message naming the
problem (shape mismatches, dtypes, axes, out arrays, overlap, 0-d and empty
rows, precision, temperature, attention options, autograd and devices);
nothing crashes and no input is modified by a failed call."""

import ml_dtypes
import numpy as np
import pytest
import torch

import softdot

sdpa = softdot.scaled_dot_product_attention

X = np.arange(12.0).reshape(3, 4) / 7
X32 = X.astype(np.float32)
Q = np.ones((2, 4, 3, 8), dtype=np.float32)
K = np.ones((2, 2, 5, 8), dtype=np.float32)
V = np.ones((2, 2, 5, 6), dtype=np.float32)


def ro(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


SHIFT = np.arange(13.0)  # a buffer for partially overlapping views

CASES = [
    # --- a 0-d x is one entry: axis 0 and -1 reduce it, others are out of
    # bounds (found by test_fuzz_api.py: any axis was ignored)
    (
        "logsumexp 0-d axis out of bounds",
        lambda: softdot.logsumexp(np.float32(0), axis=-4),
        ValueError,
        r"logsumexp: axis -4 is out of bounds for an array of 1 dimensions",
    ),
    (
        "logsumexp 0-d axis in tuple",
        lambda: softdot.logsumexp(np.float64(1), axis=(0, 2)),
        ValueError,
        r"axis 2 is out of bounds",
    ),
    # --- shapes
    (
        "out wrong shape",
        lambda: softdot.softmax(X, out=np.empty((3, 5))),
        ValueError,
        r"out has shape \(3, 5\); expected \(3, 4\)",
    ),
    (
        "out wrong shape log",
        lambda: softdot.log_softmax(X, axis=0, out=np.empty((4, 3))),
        ValueError,
        r"out has shape",
    ),
    (
        "where not broadcastable",
        lambda: softdot.softmax(X, where=np.ones(3, bool)),
        ValueError,
        r"where has shape \(3,\).*does not broadcast",
    ),
    (
        "where not broadcastable lse",
        lambda: softdot.logsumexp(X, where=np.ones((2, 4), bool)),
        ValueError,
        r"does not broadcast",
    ),
    (
        "where not boolean",
        lambda: softdot.softmax(X, where=np.ones(4, int)),
        TypeError,
        r"where has dtype int64; it must be boolean",
    ),
    (
        "backward shapes",
        lambda: softdot.softmax_backward(X, X[:, :3]),
        ValueError,
        r"y has shape \(3, 4\) but dy has shape \(3, 3\)",
    ),
    (
        "dot lengths",
        lambda: softdot.dot(np.ones(3), np.ones(4)),
        ValueError,
        r"x has shape \(3,\) but y has shape \(4,\)",
    ),
    ("dot 2-d", lambda: softdot.dot(np.ones((3, 1)), np.ones(3)), ValueError, r"must be 1-d"),
    (
        "dots E mismatch",
        lambda: softdot.dots(np.ones(3), np.ones((4, 5))),
        ValueError,
        r"keys.shape\[1\] must equal len\(query\)",
    ),
    ("chunk 2-d", lambda: softdot.softmax_state(X), ValueError, r"expected a 1-d array"),
    (
        "attention E mismatch",
        lambda: sdpa(Q, K[..., :7], V),
        ValueError,
        r"the last axes, E, must match",
    ),
    (
        "attention heads not a multiple",
        lambda: sdpa(Q[:, :3], K, V),
        ValueError,
        r"heads be a multiple",
    ),
    ("attention batch mismatch", lambda: sdpa(Q[:1], K, V), ValueError, r"batch axes must match"),
    (
        "attention S mismatch",
        lambda: sdpa(Q, K, V[:, :, :4]),
        ValueError,
        r"the key axes, S, must match",
    ),
    ("attention ndim mismatch", lambda: sdpa(Q, K[0], V[0]), ValueError, r"same number of axes"),
    ("attention 1-d", lambda: sdpa(Q[0, 0, 0], K[0, 0, 0], V[0, 0, 0]), ValueError, r"2 or more"),
    ("attention E = 0", lambda: sdpa(Q[..., :0], K[..., :0], V), ValueError, r"must be >= 1"),
    (
        "attention mask shape",
        lambda: sdpa(Q, K, V, np.ones((3, 4), bool)),
        ValueError,
        r"attn_mask has shape \(3, 4\), which does not broadcast",
    ),
    (
        "attention bias shape",
        lambda: sdpa(Q, K, V, bias=np.ones((2, 5), np.float32)),
        ValueError,
        r"bias has shape \(2, 5\)",
    ),
    (
        "attention sinks shape",
        lambda: sdpa(Q, K, V, sinks=np.zeros(3, np.float32)),
        ValueError,
        r"^scaled_dot_product_attention: sinks has 3 values but query \(2, 4, 3, 8\) has 4 heads$",
    ),
    (
        "attention out shape",
        lambda: sdpa(Q, K, V, out=np.empty((2, 4, 3, 8), np.float32)),
        ValueError,
        r"out has shape",
    ),
    (
        "merge shapes",
        lambda: softdot.attention_merge(
            np.ones((2, 3), np.float32),
            np.ones(2, np.float32),
            np.ones((2, 4), np.float32),
            np.ones(2, np.float32),
        ),
        ValueError,
        r"must be\s+equal",
    ),
    (
        "merge lse shape",
        lambda: softdot.attention_merge(
            np.ones((2, 3), np.float32),
            np.ones(3, np.float32),
            np.ones((2, 3), np.float32),
            np.ones(2, np.float32),
        ),
        ValueError,
        r"lse_a has shape \(3,\); expected \(2,\)",
    ),
    # --- dtypes
    # float16 / bfloat16 are accepted by the softmax family (test_softmax16.py);
    # 8-bit floats are not.
    (
        "float8 x",
        lambda: softdot.softmax(X.astype(ml_dtypes.float8_e4m3fn)),
        TypeError,
        r"has dtype float8_e4m3fn; accepted: float32, float64",
    ),
    (
        "float8 x log",
        lambda: softdot.log_softmax(X.astype(ml_dtypes.float8_e4m3fn)),
        TypeError,
        r"float8",
    ),
    (
        "float8 x lse",
        lambda: softdot.logsumexp(X.astype(ml_dtypes.float8_e4m3fn)),
        TypeError,
        r"float8",
    ),
    (
        "complex x",
        lambda: softdot.softmax(X.astype(np.complex128)),
        TypeError,
        r"complex128; accepted: float32, float64",
    ),
    ("string x", lambda: softdot.softmax(np.array(["a", "b"])), TypeError, r"accepted"),
    (
        "torch float8 x",
        lambda: softdot.softmax(torch.ones(3).to(torch.float8_e4m3fn)),
        TypeError,
        r"float8_e4m3fn; accepted: float32, float64",
    ),
    (
        "torch complex x",
        lambda: softdot.softmax(torch.ones(3, dtype=torch.complex64)),
        TypeError,
        r"complex64",
    ),
    (
        "backward dtypes",
        lambda: softdot.softmax_backward(X, X32),
        TypeError,
        r"y has dtype float64 but dy has dtype float32",
    ),
    (
        "dot dtypes",
        lambda: softdot.dot(np.ones(3), np.ones(3, np.float32)),
        TypeError,
        r"x has dtype float64 but y has dtype float32",
    ),
    (
        "dots float16",
        lambda: softdot.dots(np.ones(3, np.float16), np.ones((2, 3), np.float16)),
        TypeError,
        r"float16",
    ),
    (
        "attention float64 query, float32 keys",
        lambda: sdpa(Q.astype(np.float64), K, V),
        TypeError,
        r"query is float64, so key must be float64 too",
    ),
    (
        "attention torch float64 query, float32 keys",
        lambda: sdpa(torch.from_numpy(Q).double(), torch.from_numpy(K), torch.from_numpy(V)),
        TypeError,
        r"query is float64, so key must be float64 too",
    ),
    (
        "attention float64 keys",
        lambda: sdpa(Q, K.astype(np.float64), V.astype(np.float64)),
        TypeError,
        r"key has dtype float64; accepted: float32, float16, bfloat16",
    ),
    (
        "attention K/V dtypes differ",
        lambda: sdpa(Q, K, V.astype(np.float16)),
        TypeError,
        r"they must be the same",
    ),
    (
        "attention int mask",
        lambda: sdpa(Q, K, V, np.ones((3, 5), int)),
        TypeError,
        r"attn_mask has dtype int64",
    ),
    (
        "attention out float64",
        lambda: sdpa(Q, K, V, out=np.empty((2, 4, 3, 6))),
        TypeError,
        r"out has dtype float64; expected float32",
    ),
    (
        "merge float64",
        lambda: softdot.attention_merge(np.ones((2, 3)), np.ones(2), np.ones((2, 3)), np.ones(2)),
        TypeError,
        r"out_a has dtype float64; accepted: float32",
    ),
    (
        "state merge dtypes",
        lambda: softdot.softmax_state(np.ones(3)).merge(
            softdot.softmax_state(np.ones(3, np.float32))
        ),
        TypeError,
        r"float64 and float32",
    ),
    (
        "apply dtype",
        lambda: softdot.softmax_apply(np.ones(3, np.float32), softdot.softmax_state(np.ones(3))),
        TypeError,
        r"chunk has dtype float32 but total is a state of float64",
    ),
    (
        "apply total not a state",
        lambda: softdot.softmax_apply(np.ones(3), (1.0, 2.0, 0.0)),
        TypeError,
        r"total must be a SoftmaxState",
    ),
    # --- axes
    (
        "axis out of range",
        lambda: softdot.softmax(X, axis=2),
        np.exceptions.AxisError,
        r"axis 2 is out of bounds for an array of 2 dimensions",
    ),
    (
        "negative axis out of range",
        lambda: softdot.log_softmax(X, axis=-3),
        np.exceptions.AxisError,
        r"axis -3 is out of bounds",
    ),
    (
        "lse axis out of range",
        lambda: softdot.logsumexp(X, axis=(0, 2)),
        np.exceptions.AxisError,
        r"axis 2 is out of bounds",
    ),
    (
        "backward axis out of range",
        lambda: softdot.softmax_backward(X, X, axis=5),
        np.exceptions.AxisError,
        r"out of bounds",
    ),
    (
        "axis not an integer",
        lambda: softdot.softmax(X, axis=1.0),
        TypeError,
        r"axis must be an integer",
    ),
    (
        "lse repeated axis",
        lambda: softdot.logsumexp(X, axis=(1, -1)),
        ValueError,
        r"repeats an axis",
    ),
    # --- out arrays
    (
        "read-only out",
        lambda: softdot.softmax(X, out=ro(np.empty((3, 4)))),
        ValueError,
        r"out is read-only",
    ),
    (
        "read-only out, axis 0",
        lambda: softdot.softmax(X, axis=0, out=ro(np.empty((3, 4)))),
        ValueError,
        r"read-only",
    ),
    (
        "read-only out log",
        lambda: softdot.log_softmax(X, out=ro(np.empty((3, 4)))),
        ValueError,
        r"read-only",
    ),
    (
        "read-only out lse",
        lambda: softdot.logsumexp(X, axis=1, out=ro(np.empty(3))),
        ValueError,
        r"read-only",
    ),
    (
        "read-only out attention",
        lambda: sdpa(Q, K, V, out=ro(np.empty((2, 4, 3, 6), np.float32))),
        ValueError,
        r"read-only",
    ),
    (
        "out of another dtype",
        lambda: softdot.softmax(X, out=np.empty((3, 4), np.float32)),
        TypeError,
        r"out has dtype float32; expected float64",
    ),
    (
        "out of another dtype log",
        lambda: softdot.log_softmax(X32, out=np.empty((3, 4))),
        TypeError,
        r"out has dtype float64; expected float32",
    ),
    (
        "out of another dtype lse",
        lambda: softdot.logsumexp(X, axis=0, out=np.empty(4, np.float32)),
        TypeError,
        r"expected float64",
    ),
    (
        "torch out for numpy x",
        lambda: softdot.softmax(X, out=torch.empty(3, 4, dtype=torch.float64)),
        TypeError,
        r"out must be a numpy.ndarray",
    ),
    (
        "numpy out for torch x",
        lambda: softdot.softmax(torch.from_numpy(X), out=np.empty((3, 4))),
        TypeError,
        r"out must be a torch.Tensor",
    ),
    (
        "torch out of another dtype",
        lambda: softdot.softmax(torch.from_numpy(X), out=torch.empty(3, 4)),
        TypeError,
        r"expected float64",
    ),
    (
        "torch out requires grad",
        lambda: softdot.softmax(
            torch.from_numpy(X), out=torch.empty(3, 4, dtype=torch.float64, requires_grad=True)
        ),
        ValueError,
        r"out requires grad",
    ),
    (
        "numpy keys for torch query",
        lambda: softdot.dots(torch.ones(3), np.ones((2, 3))),
        TypeError,
        r"keys must be a torch.Tensor",
    ),
    (
        "torch key for numpy query",
        lambda: sdpa(Q, torch.from_numpy(K), V),
        TypeError,
        r"key is a torch.Tensor but .* numpy",
    ),
    ("partial overlap", lambda: softdot.softmax(SHIFT[:12], out=SHIFT[1:]), ValueError, r"overlap"),
    (
        "partial overlap, axis 0",
        lambda: softdot.softmax(SHIFT[:12].reshape(3, 4), axis=0, out=SHIFT[1:].reshape(3, 4)),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap log",
        lambda: softdot.log_softmax(SHIFT[:12], out=SHIFT[1:]),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap where",
        lambda: softdot.softmax(SHIFT[:12], out=SHIFT[1:], where=np.ones(12, bool)),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap backward",
        lambda: softdot.softmax_backward(SHIFT[:12], SHIFT[:12] * 0, out=SHIFT[1:]),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap apply",
        lambda: softdot.softmax_apply(SHIFT[:12], softdot.softmax_state(SHIFT[:12]), out=SHIFT[1:]),
        ValueError,
        r"overlap",
    ),
    (
        "lse out inside x",
        lambda: softdot.logsumexp(SHIFT[:12].reshape(3, 4), axis=1, out=SHIFT[:3]),
        ValueError,
        r"overlap",
    ),
    (
        "attention out is query",
        lambda: (lambda q: sdpa(q, K, K, out=q))(Q.copy()),
        ValueError,
        r"overlap",
    ),
    (
        "attention out overlaps value",
        lambda: (
            lambda b: sdpa(Q, K, b[:120].reshape(2, 2, 5, 6), out=b[60:204].reshape(2, 4, 3, 6))
        )(np.ones(204, np.float32)),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap backward, axis 0",
        lambda: softdot.softmax_backward(
            SHIFT[:12].reshape(3, 4), np.ones((3, 4)), axis=0, out=SHIFT[1:].reshape(3, 4)
        ),
        ValueError,
        r"overlap",
    ),
    (
        "partial overlap, strided rows",
        lambda: (
            lambda b: softdot.softmax(
                b[:12].reshape(3, 2, 2)[..., 0], out=b[2:14].reshape(3, 2, 2)[..., 0]
            )
        )(np.arange(16.0)),
        ValueError,
        r"overlap",
    ),
    # --- 0-d and empty
    ("0-d x", lambda: softdot.softmax(np.float64(2.0)), ValueError, r"0-d"),
    ("0-d array", lambda: softdot.log_softmax(np.array(2.0)), ValueError, r"0-d"),
    (
        "0-d backward",
        lambda: softdot.softmax_backward(np.array(1.0), np.array(1.0)),
        ValueError,
        r"0-d",
    ),
    ("empty row", lambda: softdot.softmax(np.ones((3, 0))), ValueError, r"shape \(3, 0\).*empty"),
    (
        "empty row log",
        lambda: softdot.log_softmax(np.ones((3, 0), np.float32)),
        ValueError,
        r"empty",
    ),
    ("empty axis 0", lambda: softdot.softmax(np.ones((0, 3)), axis=0), ValueError, r"empty"),
    ("empty lse", lambda: softdot.logsumexp(np.ones((2, 0)), axis=1), ValueError, r"hold no entry"),
    ("empty lse all", lambda: softdot.logsumexp(np.ones(0)), ValueError, r"hold no entry"),
    (
        "empty backward row",
        lambda: softdot.softmax_backward(np.ones((2, 0)), np.ones((2, 0))),
        ValueError,
        r"empty",
    ),
    # --- options
    (
        "bad precision",
        lambda: softdot.softmax(X, precision="exact"),
        ValueError,
        r"precision must be 'faithful' or 'fast', not 'exact'",
    ),
    (
        "bad precision type",
        lambda: softdot.softmax(X, precision=None),
        ValueError,
        r"precision must be",
    ),
    (
        "temperature 0",
        lambda: softdot.softmax(X, temperature=0),
        ValueError,
        r"temperature must be finite and > 0, got 0.0",
    ),
    (
        "temperature negative",
        lambda: softdot.log_softmax(X, temperature=-1.5),
        ValueError,
        r"temperature must be finite and > 0, got -1.5",
    ),
    (
        "temperature nan",
        lambda: softdot.logsumexp(X, temperature=float("nan")),
        ValueError,
        r"got nan",
    ),
    (
        "temperature inf",
        lambda: softdot.softmax(X, temperature=float("inf")),
        ValueError,
        r"got inf",
    ),
    (
        "temperature not a number",
        lambda: softdot.softmax(X, temperature="hot"),
        TypeError,
        r"temperature must be a real number",
    ),
    (
        "temperature state",
        lambda: softdot.softmax_state(np.ones(3), temperature=0),
        ValueError,
        r"temperature",
    ),
    (
        "temperature whose reciprocal overflows",
        lambda: softdot.softmax(X32, temperature=1e-40),
        ValueError,
        r"temperature 1e-40",
    ),
    (
        "attention scale 0",
        lambda: sdpa(Q, K, V, scale=0),
        ValueError,
        r"scale must be finite and > 0",
    ),
    ("attention scale nan", lambda: sdpa(Q, K, V, scale=float("nan")), ValueError, r"scale"),
    (
        "attention softcap negative",
        lambda: sdpa(Q, K, V, softcap=-1),
        ValueError,
        r"softcap must be finite and >= 0",
    ),
    (
        "attention window",
        lambda: sdpa(Q, K, V, window=(-2, 0)),
        ValueError,
        r"^scaled_dot_product_attention: window_left and window_right must be >= -1, "
        r"got -2 and 0$",
    ),
    (
        "attention window not a pair",
        lambda: sdpa(Q, K, V, window=3),
        ValueError,
        r"window must be a pair",
    ),
    (
        "attention kv_range negative",
        lambda: sdpa(Q, K, V, kv_range=(-1, 2)),
        ValueError,
        r"negative bound",
    ),
    (
        "attention kv_range reversed",
        lambda: sdpa(Q, K, V, kv_range=(4, 2)),
        ValueError,
        r"kv_begin 4 is past kv_end 2",
    ),
    (
        "attention kv_range past the keys",
        lambda: sdpa(Q, K, V, kv_range=(9, None)),
        ValueError,
        r"kv_begin 9",
    ),
    (
        "force_simd_target unknown",
        lambda: softdot.force_simd_target("NOPE"),
        ValueError,
        r"not a SIMD target",
    ),
    # --- autograd and devices
    # (attention on inputs that require grad is an autograd Function now:
    # tests/python/test_attention_grad.py; what it refuses:)
    (
        "attention out= with grad",
        lambda: sdpa(
            torch.from_numpy(Q).requires_grad_(),
            torch.from_numpy(K),
            torch.from_numpy(V),
            out=torch.empty(Q.shape[:-1] + (V.shape[-1],)),
        ),
        ValueError,
        r"out= cannot be used on inputs that require grad",
    ),
    (
        "attention int8 key with grad",
        lambda: sdpa(
            torch.from_numpy(Q).requires_grad_(),
            (torch.zeros(K.shape, dtype=torch.int8), torch.ones(K.shape[:-1] + (1,))),
            (torch.zeros(V.shape, dtype=torch.int8), torch.ones(V.shape[:-1] + (1,))),
        ),
        TypeError,
        r"key is tuple",
    ),
    (
        "weights input requires grad",
        lambda: softdot.attention_weights(
            torch.from_numpy(Q).requires_grad_(), torch.from_numpy(K)
        ),
        NotImplementedError,
        r"backward",
    ),
    (
        "softmax where with grad",
        lambda: softdot.softmax(
            torch.ones(3, dtype=torch.float64, requires_grad=True), where=torch.ones(3, dtype=bool)
        ),
        NotImplementedError,
        r"requires grad",
    ),
    ("meta x", lambda: softdot.softmax(torch.empty(3, device="meta")), ValueError, r"meta.*CPU"),
    (
        "meta x log",
        lambda: softdot.log_softmax(torch.empty(2, 3, device="meta")),
        ValueError,
        r"CPU",
    ),
    ("meta x lse", lambda: softdot.logsumexp(torch.empty(3, device="meta")), ValueError, r"CPU"),
    (
        "meta out",
        lambda: softdot.softmax(torch.ones(3), out=torch.empty(3, device="meta")),
        ValueError,
        r"CPU",
    ),
    (
        "meta dy",
        lambda: softdot.softmax_backward(torch.ones(3), torch.empty(3, device="meta")),
        ValueError,
        r"CPU",
    ),
    (
        "meta dot",
        lambda: softdot.dot(torch.empty(3, device="meta"), torch.ones(3)),
        ValueError,
        r"CPU",
    ),
    (
        "meta where",
        lambda: softdot.softmax(torch.ones(3), where=torch.ones(3, dtype=bool, device="meta")),
        ValueError,
        r"CPU",
    ),
    (
        "meta query",
        lambda: sdpa(*(torch.empty(1, 3, 4, device="meta") for _ in range(3))),
        ValueError,
        r"meta.*CPU",
    ),
    (
        "meta key",
        lambda: sdpa(torch.ones(1, 3, 4), torch.empty(1, 3, 4, device="meta"), torch.ones(1, 3, 4)),
        ValueError,
        r"CPU",
    ),
]


@pytest.mark.parametrize("name,call,exc,match", CASES, ids=[c[0] for c in CASES])
def test_error(name, call, exc, match):
    saved = [a.copy() for a in (X, X32, Q, K, V, SHIFT)]
    with pytest.raises(exc, match=match):
        call()
    for a, s in zip((X, X32, Q, K, V, SHIFT), saved):
        np.testing.assert_array_equal(a, s)


def test_axis_error_is_a_value_error():
    with pytest.raises(ValueError):
        softdot.softmax(X, axis=7)
    with pytest.raises(ValueError):
        softdot.logsumexp(X, axis=-3)


def test_errors_leave_inputs_and_out_unmodified():
    x = np.linspace(-3, 3, 12).reshape(3, 4)
    xc = x.copy()
    out = np.full((3, 4), 5.0)
    with pytest.raises(ValueError):
        softdot.softmax(x, out=out, where=np.ones(3, bool))
    with pytest.raises(ValueError):
        softdot.softmax(x, out=out, temperature=0)
    np.testing.assert_array_equal(x, xc)
    np.testing.assert_array_equal(out, np.full((3, 4), 5.0))
    t = torch.from_numpy(x.copy())
    with pytest.raises(TypeError):
        softdot.softmax(t, out=torch.empty(3, 4))
    assert torch.equal(t, torch.from_numpy(xc))
    # The partially overlapping buffer is untouched by the refused call.
    buf = np.arange(13.0)
    with pytest.raises(ValueError, match="overlap"):
        softdot.softmax(buf[:12], out=buf[1:])
    np.testing.assert_array_equal(buf, np.arange(13.0))


def test_no_crash_on_odd_inputs():
    """Inputs at the edges work or raise a Python exception, never crash."""
    y = softdot.softmax(np.ones((1, 1)))
    assert y.shape == (1, 1) and y[0, 0] == 1
    assert softdot.log_softmax(np.ones(1))[0] == 0
    assert softdot.logsumexp(np.zeros(1)) == 0
    # S = 0: every row fully masked.
    out, lse = sdpa(Q, K[:, :, :0], V[:, :, :0], return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)
    # Broadcast (stride-0) views as x are read correctly.
    b = np.broadcast_to(np.array([1.0, 2.0, 3.0]), (4, 3))
    np.testing.assert_array_equal(softdot.softmax(b), np.tile(softdot.softmax(b[0]), (4, 1)))
    np.testing.assert_array_equal(softdot.softmax(b, axis=0), np.full((4, 3), 0.25))
    # A broadcast view cannot be an out.
    with pytest.raises(ValueError):
        softdot.softmax(np.ones((4, 3)), out=np.broadcast_to(np.empty(3), (4, 3)))


@pytest.mark.parametrize("fn", [softdot.softmax, softdot.log_softmax])
def test_empty_batch(fn):
    """Zero rows of a non-empty row axis: an empty result, as numpy, scipy and
    torch give (nothing to normalize), the same through every path."""
    for dtype in (np.float32, np.float64):
        x = np.ones((0, 5), dtype=dtype)
        y = fn(x)
        assert y.shape == (0, 5) and y.dtype == dtype
        assert fn(x, axis=1).shape == (0, 5)
        t = fn(torch.ones(0, 5, dtype=torch.float64))
        assert isinstance(t, torch.Tensor) and t.shape == (0, 5)
    assert softdot.logsumexp(np.ones((0, 5)), axis=1).shape == (0,)


def test_non_native_byte_order_float64():
    """A big-endian float64 array (e.g. read from a FITS or .npy file written
    on another machine) is a float64 array: accepted, same values."""
    xb = X.astype(">f8")
    assert xb.dtype.kind == "f" and xb.dtype.itemsize == 8
    np.testing.assert_array_equal(softdot.softmax(xb), softdot.softmax(X))


def test_interleaved_out_is_not_an_overlap():
    """x and out interleaved in one buffer (x[::2], out[1::2]) share no element:
    allowed, and the result is the softmax of x (np.shares_memory decides, not
    the address ranges)."""
    buf = np.arange(24.0).reshape(12, 2) / 7
    x, out = buf[:, 0].reshape(3, 4), buf[:, 1].reshape(3, 4)
    want = softdot.softmax(x.copy())
    got = softdot.softmax(x, out=out)
    assert got is out
    np.testing.assert_array_equal(out, want)
    rows = np.arange(40.0).reshape(8, 5) / 3  # whole rows interleaved
    xr, outr = rows[0::2], rows[1::2]
    want = softdot.log_softmax(xr.copy())
    softdot.log_softmax(xr, out=outr)
    np.testing.assert_array_equal(outr, want)


def test_attention_out_interleaved_with_query_is_allowed():
    """Attention's out may interleave with an input it shares no element with
    (rows of one buffer taken alternately): np.shares_memory decides, so this
    runs and equals the result on separate arrays."""
    rng = np.random.default_rng(5)
    buf = np.zeros((6, 2, 8), np.float32)
    q, out = buf[:, 0, :], buf[:, 1, :]
    q[...] = rng.standard_normal((6, 8), dtype=np.float32)
    k = rng.standard_normal((5, 8), dtype=np.float32)
    v = rng.standard_normal((5, 8), dtype=np.float32)
    want = softdot.scaled_dot_product_attention(q.copy(), k, v)
    assert softdot.scaled_dot_product_attention(q, k, v, out=out) is out
    np.testing.assert_array_equal(out, want)


# ---- errors in the caller's terms: its argument names, shapes, axis order and indices ----


def test_write_kv_names_the_bad_value_by_the_callers_index():
    pages = np.zeros((4, 16, 2, 8), np.int8), np.ones((4, 16, 2, 1), np.float32)
    key = np.random.default_rng(0).random((3, 2, 8)).astype(np.float32)
    key[1, 0, 3] = np.inf
    with pytest.raises(ValueError, match=r"write_kv: key holds inf at \[1, 0, 3\] \(slot 1\)"):
        softdot.write_kv(key, np.zeros_like(key), pages, tuple(a.copy() for a in pages), [0, 1, 2])
    assert not pages[0].any()  # nothing written


def test_paged_errors_name_the_callers_cache_shape_and_layout():
    cache = np.zeros((64, 16, 2, 64), np.float32)  # NHD: 16-token pages, 2 KV heads
    q = np.zeros((1, 4, 1, 32), np.float32)
    table, lens = np.zeros((1, 1), np.int32), np.array([5], np.int32)
    with pytest.raises(ValueError) as e:
        softdot.paged_attention(q, cache, cache, table, lens)
    m = str(e.value)
    assert "key_cache (64, 16, 2, 64) has d = 64 but query (1, 4, 1, 32) has d = 32" in m, m
    assert "k_pages" not in m and "[64, 2, 16, 64]" not in m, m
    # The shape fits NHD, not the HND asked for: the hint names kv_layout.
    q64 = np.zeros((1, 4, 1, 64), np.float32)
    with pytest.raises(ValueError, match=r"with kv_layout='NHD' it has 2 KV heads"):
        softdot.paged_attention(q64, cache, cache, table, lens, kv_layout="HND")
    # A bad page index names the caller's argument.
    with pytest.raises(ValueError, match=r"not a page: key_cache has 64 pages"):
        softdot.paged_attention(q64, cache, cache, np.full((1, 1), 70, np.int32), lens)


def test_ragged_sequence_with_more_rows_than_keys_is_an_error():
    cache = np.zeros((4, 16, 2, 64), np.float32)
    q = np.zeros((6, 4, 64), np.float32)
    with pytest.raises(ValueError, match=r"sequence 0 has 3 query rows .* seq_lens\[0\] = 2 keys"):
        softdot.paged_attention(
            q,
            cache,
            cache,
            np.array([[0], [1]], np.int32),
            np.array([2, 3], np.int32),
            query_start_loc=np.array([0, 3, 6], np.int32),
            causal=True,
        )


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "logsumexp"])
def test_softmax_dtype_error_lists_every_accepted_dtype(fn):
    with pytest.raises(TypeError) as e:
        getattr(softdot, fn)(np.zeros(3, np.complex64))
    for name in ("float32", "float64", "float16", "bfloat16"):
        assert name in str(e.value), str(e.value)


def test_speculative_accept_ragged_drafts_get_a_message():
    logits = np.zeros((2, 3, 5), np.float32)
    with pytest.raises(ValueError, match=r"speculative_accept: draft_tokens is ragged"):
        softdot.speculative_accept([[1, 2], [3]], None, logits, seed=1)
