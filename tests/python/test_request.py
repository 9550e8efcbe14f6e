"""One attention request (python/softdot/_request.py, the library's
AttentionRequest): each option's bad value gives the library's one message,
named after the function called and in the caller's terms (its argument
names and shapes), from every entry point (scaled_dot_product_
attention, attention_weights, paged_attention, softdot.distributed.ring_attention
under mpirun); torch's keywords; zero query rows; the key-range message."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import softdot

HERE = os.path.dirname(os.path.abspath(__file__))
RNG = np.random.default_rng(5)
Q = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
K = RNG.standard_normal((1, 1, 5, 4)).astype(np.float32)
V = RNG.standard_normal((1, 1, 5, 4)).astype(np.float32)
# The same keys and values as a paged cache (NHD: [pages, page_size, Hkv, E]),
# pages of 2 tokens in reverse order.
TABLE = np.array([[2, 1, 0]], np.int32)
LENS = np.array([5], np.int32)


def pages(x):
    p = np.zeros((3, 2, 1, 4), np.float32)
    for j in range(5):
        p[TABLE[0, j // 2], j % 2, 0] = x[0, 0, j]
    return p


KP, VP = pages(K), pages(V)

# (keyword arguments, the library's message after "<function>: ").
BAD_OPTIONS = [
    ({"scale": 0.0}, "scale must be finite and > 0 (also as a float), got 0"),
    ({"scale": -np.inf}, "scale must be finite and > 0 (also as a float), got -inf"),
    ({"scale": 1e-50}, "scale must be finite and > 0 (also as a float), got 1e-50"),
    ({"scale": float("nan")}, "scale must be finite and > 0 (also as a float), got nan"),
    ({"softcap": -1.0}, "softcap must be finite and >= 0, got -1"),
    ({"softcap": np.inf}, "softcap must be finite and >= 0, got inf"),
    ({"window": (-2, -1)}, "window_left and window_right must be >= -1, got -2 and -1"),
    ({"window": (-1, -3)}, "window_left and window_right must be >= -1, got -1 and -3"),
    ({"sinks": np.zeros(3, np.float32)}, "sinks has 3 values but query (1, 2, 3, 4) has 2 heads"),
]
# kv_range is not an option of ring_attention (the ring sets the key ranges).
BAD_RANGES = [({"kv_range": (4, 3)}, "kv_begin 4 is past kv_end 3")]

ENTRY_POINTS = {
    "scaled_dot_product_attention": lambda kw: softdot.scaled_dot_product_attention(Q, K, V, **kw),
    "attention_weights": lambda kw: softdot.attention_weights(Q, K, **kw),
    "paged_attention": lambda kw: softdot.paged_attention(Q, KP, VP, TABLE, LENS, **kw),
}


def ids(cases):
    return [",".join(f"{k}={v!r}" for k, v in kw.items()) for kw, _ in cases]


@pytest.mark.parametrize("fn", list(ENTRY_POINTS))
@pytest.mark.parametrize("kw,message", BAD_OPTIONS + BAD_RANGES, ids=ids(BAD_OPTIONS + BAD_RANGES))
def test_each_bad_option_gives_the_librarys_message(fn, kw, message):
    with pytest.raises(ValueError) as e:
        ENTRY_POINTS[fn](kw)
    assert str(e.value) == f"{fn}: {message}"


def test_the_same_messages_from_torch_tensors():
    t = torch.from_numpy
    for kw, message in BAD_OPTIONS:
        kw = {k: (t(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        with pytest.raises(ValueError) as e:
            softdot.scaled_dot_product_attention(t(Q), t(K), t(V), **kw)
        assert str(e.value) == f"scaled_dot_product_attention: {message}"


def _ring_missing():
    if importlib.util.find_spec("softdot._softdot_mpi") is None:
        return "softdot was built without MPI (no softdot._softdot_mpi)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    if shutil.which("mpirun") is None:
        return "no mpirun on PATH"
    return None


@pytest.mark.skipif(_ring_missing() is not None, reason=str(_ring_missing()))
def test_ring_attention_gives_the_same_messages(tmp_path):
    """ring_attention under mpirun (one rank): every bad option, the same
    message as the other entry points, named ring_attention (after the rank
    that failed: its checks are collective)."""
    script = tmp_path / "ring_options.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import numpy as np
        from mpi4py import MPI
        import softdot.distributed as sdist
        from test_request import BAD_OPTIONS
        rng = np.random.default_rng(5)
        q = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
        k = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
        for kw, message in BAD_OPTIONS:
            try:
                sdist.ring_attention(MPI.COMM_WORLD, q, k, k, seq_len=5, layout="contiguous",
                                     **kw)
                print("NO ERROR", kw)
            except ValueError as e:
                print("MESSAGE", str(e))
        """)
    )
    cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", "1"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    cmd += [sys.executable, str(script)]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = [
        line[len("MESSAGE ") :]
        for line in r.stdout.splitlines()
        if line.startswith(("MESSAGE", "NO ERROR"))
    ]
    # The checks are collective: the first failing rank is named first.
    want = [
        f"rank 0: ring_attention: {m}".replace("query (1, 2, 3, 4)", "query (1, 2, 5, 4)")
        for _, m in BAD_OPTIONS
    ]
    # NaN among them: the library refuses it as any other bad scale (not set
    # is None, never a NaN).
    assert got == want, r.stdout + r.stderr


def test_kv_range_past_the_keys_shows_the_callers_range():
    with pytest.raises(ValueError) as e:
        softdot.scaled_dot_product_attention(Q, K, V, kv_range=(12, 20))
    assert str(e.value) == "scaled_dot_product_attention: kv_begin 12 is past n_kv = 5 (kv_end 20)"
    with pytest.raises(ValueError) as e:
        softdot.scaled_dot_product_attention(Q, K, V, kv_range=(12, None))
    assert str(e.value) == "scaled_dot_product_attention: kv_begin 12 is past n_kv = 5"


@pytest.mark.parametrize("value", ["2", True, None, [1.0]])
def test_option_types(value):
    with pytest.raises(TypeError, match=r"^scaled_dot_product_attention: softcap must be a real "):
        softdot.scaled_dot_product_attention(Q, K, V, softcap=value)


def test_zero_query_rows_give_an_empty_result():
    q0 = np.zeros((1, 2, 0, 4), np.float32)
    out, lse = softdot.scaled_dot_product_attention(q0, K, V, return_lse=True)
    assert out.shape == (1, 2, 0, 4) and out.dtype == np.float32
    assert lse.shape == (1, 2, 0)
    w = softdot.attention_weights(q0, K)
    assert w.shape == (1, 2, 0, 5)
    pt = softdot.paged_attention(q0, KP, VP, TABLE, LENS)
    assert pt.shape == (1, 2, 0, 4)
    t = torch.nn.functional.scaled_dot_product_attention(
        torch.zeros(1, 2, 0, 4),
        torch.from_numpy(K).expand(1, 2, 5, 4),
        torch.from_numpy(V).expand(1, 2, 5, 4),
    )
    got = softdot.scaled_dot_product_attention(
        torch.zeros(1, 2, 0, 4), torch.from_numpy(K), torch.from_numpy(V)
    )
    assert isinstance(got, torch.Tensor) and got.shape == t.shape


def test_torch_keywords():
    q = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    tril = np.tril(np.ones((3, 5), bool))  # torch's is_causal: key j <= query i
    want = softdot.scaled_dot_product_attention(q, K, V, attn_mask=tril)
    got = softdot.scaled_dot_product_attention(q, K, V, is_causal=True)
    assert np.array_equal(got, want)
    # torch's own result for the same call agrees within float rounding.
    tq, tk, tv = (torch.from_numpy(a) for a in (q, K, V))
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq, tk.expand(1, 2, 5, 4), tv.expand(1, 2, 5, 4), is_causal=True
    )
    assert np.allclose(got, ref.numpy(), rtol=1e-5, atol=1e-6)
    # bottom-right causal (softdot's) differs when L != S.
    assert not np.array_equal(softdot.scaled_dot_product_attention(q, K, V, causal=True), got)
    assert np.array_equal(
        softdot.scaled_dot_product_attention(q, K, V, enable_gqa=True),
        softdot.scaled_dot_product_attention(q, K, V),
    )
    assert np.array_equal(
        softdot.scaled_dot_product_attention(q, K, V, dropout_p=0.0),
        softdot.scaled_dot_product_attention(q, K, V),
    )
    with pytest.raises(ValueError, match=r"dropout_p must be 0 .*got 0.1"):
        softdot.scaled_dot_product_attention(q, K, V, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"causal= .* or is_causal="):
        softdot.scaled_dot_product_attention(q, K, V, causal=True, is_causal=True)


def test_partial_and_gradient_targets_of_the_one_request():
    """The bound request's other targets: kind "partial" finalized is kind
    "output" bit for bit, two key halves merged (AttentionPartial.merge) are
    within a float rounding of it; kind "gradients" is the autograd
    backward's bits; a float64 request runs the double functions."""
    core = softdot._request._core
    R = softdot._request
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 11, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 11, 4)).astype(np.float32)
    kv = {"format": R.KV_F32, "k": k, "v": v}
    o = R.options("t", causal=True)
    out = np.empty((1, 2, 7, 4), np.float32)
    lse = np.empty((1, 2, 7), np.float32)
    core.attention_request("t", q, R.KV_F32, kv, "output", out, R.KV_F32, lse.reshape(-1), o)
    part = core.AttentionPartial.empty(1, 2, 0, 4)
    core.attention_request("t", q, R.KV_F32, kv, "partial", None, R.KV_F32, None, o, None, part)
    assert (part.batch, part.heads, part.rows, part.dv) == (1, 2, 7, 4)
    got, got_lse = np.empty_like(out), np.empty_like(lse)
    part.finalize(got, got_lse.reshape(-1))
    assert got.tobytes() == out.tobytes() and got_lse.tobytes() == lse.tobytes()
    halves = []
    for b, e in ((0, 5), (5, 11)):
        p = core.AttentionPartial.empty(1, 2, 7, 4)
        ob = R.options("t", causal=True, kv_range=(b, e))
        core.attention_request("t", q, R.KV_F32, kv, "partial", None, R.KV_F32, None, ob, None, p)
        halves.append(p)
    halves[0].merge(halves[1])
    halves[0].finalize(got, None)
    np.testing.assert_allclose(got, out, rtol=2e-6, atol=1e-7)
    # The gradients: the autograd backward's bits (float32 and float64).
    for dt, fmt in ((np.float32, R.KV_F32), (np.float64, R.KV_F64)):
        tq, tk, tv = (torch.from_numpy(a.astype(dt)).requires_grad_() for a in (q, k, v))
        to, tl = softdot.scaled_dot_product_attention(tq, tk, tv, causal=True, return_lse=True)
        do = torch.from_numpy(rng.standard_normal((1, 2, 7, 4)).astype(dt))
        to.backward(do)
        grads = {n: np.empty(a.shape, dt) for n, a in (("dq", q), ("dk", k), ("dv", v))}
        io = {"out": to.detach().numpy(), "lse": tl.detach().numpy().reshape(-1)}
        io.update(dout=do.numpy(), **grads)
        kv_t = {"format": fmt, "k": k.astype(dt), "v": v.astype(dt)}
        core.attention_request(
            "t", q.astype(dt), fmt, kv_t, "gradients", None, fmt, None, o, backward=io
        )
        for n, t in (("dq", tq), ("dk", tk), ("dv", tv)):
            assert grads[n].tobytes() == t.grad.numpy().tobytes(), (dt, n)
    with pytest.raises(ValueError, match="kind 'gradients' needs the backward dict"):
        core.attention_request("t", q, R.KV_F32, kv, "gradients", None, R.KV_F32, None, o)
