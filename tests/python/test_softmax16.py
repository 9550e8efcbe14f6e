"""The softmax family on 16-bit inputs (torch bfloat16 / float16, numpy
ml_dtypes.bfloat16 / float16): the dtype comes back, the bits are the same
from torch and numpy, and every result is the float64 reference rounded once
to the format (a miss only where the reference sits within its own error of
a midpoint, counted and bounded)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import softdot

torch = pytest.importorskip("torch")

FORMATS = [
    ("bfloat16", np.dtype(ml_dtypes.bfloat16), torch.bfloat16),
    ("float16", np.dtype(np.float16), torch.float16),
]


def rounded(ref: np.ndarray, dt: np.dtype) -> np.ndarray:
    """float64 values rounded once to dt (round to odd to float32, then to
    16 bits: no double rounding)."""
    ref = np.asarray(ref, dtype=np.float64)
    f = ref.astype(np.float32)
    u = f.view(np.uint32).copy()
    fin = np.isfinite(ref)
    inexact = fin & (f.astype(np.float64) != ref)
    away = inexact & (np.abs(f.astype(np.float64)) > np.abs(ref))
    u[away] -= 1
    u[inexact] |= 1
    return u.view(np.float32).astype(dt)


def ulp_misses(got: np.ndarray, ref: np.ndarray, dt: np.dtype) -> int:
    """Entries that differ from the correctly rounded reference; each must be
    a neighbour of it (one step of the 16-bit grid)."""
    want = rounded(ref, dt)
    g = got.view(np.uint16).astype(np.int64)
    w = want.view(np.uint16).astype(np.int64)
    both_zero = (got.astype(np.float64) == 0) & (want.astype(np.float64) == 0)
    same = (g == w) | both_zero | (np.isnan(got.astype(np.float64)) & np.isnan(ref))
    assert np.all(np.abs(g - w)[~same] == 1), (got[~same], want[~same])
    return int(np.count_nonzero(~same))


def ref_softmax(x: np.ndarray, t: float = 1.0):
    s = np.float64(np.float32(1.0 / t))
    p = x.astype(np.float64) * s
    m = p.max(axis=-1, keepdims=True)
    e = np.exp(p - m)
    S = e.sum(axis=-1, keepdims=True)
    return e / S, (p - m) - np.log(S), (m + np.log(S))[..., 0]


def logits(shape, dt, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(dt)


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_dtype_in_dtype_out_and_reference(name, dt, tdt):
    x = logits((64, 1000), dt)
    w, lw, lse = ref_softmax(x)
    y = softdot.softmax(x)
    ly = softdot.log_softmax(x)
    ls = softdot.logsumexp(x, axis=-1)
    assert y.dtype == dt and ly.dtype == dt and ls.dtype == dt
    assert ulp_misses(y, w, dt) == 0
    assert ulp_misses(ly, lw, dt) <= 2
    assert ulp_misses(ls, lse, dt) == 0
    # torch: the same bits, the tensor's dtype.
    xt = torch.from_numpy(x.view(np.int16)).view(tdt)
    yt, lyt, lst = softdot.softmax(xt), softdot.log_softmax(xt), softdot.logsumexp(xt, axis=-1)
    assert yt.dtype == tdt and lyt.dtype == tdt and lst.dtype == tdt
    for a, b in ((yt, y), (lyt, ly), (lst, ls)):
        assert np.array_equal(a.view(torch.int16).numpy(), b.view(np.int16))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
@pytest.mark.parametrize("n", [1, 3, 17, 4096, 40000])
def test_lengths_axis_where_temperature(name, dt, tdt, n):
    x = logits((3, n), dt, seed=n)
    y = softdot.softmax(x, temperature=0.7)
    w, _, _ = ref_softmax(x, 0.7)
    assert ulp_misses(y, w, dt) == 0
    # axis 0 of the transpose: the same bits.
    yT = softdot.softmax(np.ascontiguousarray(x.T), axis=0)
    assert np.array_equal(yT.T.view(np.uint16), softdot.softmax(x).view(np.uint16))
    # where: excluded entries get exactly 0, the rest as if absent.
    keep = np.ones_like(x, dtype=bool)
    keep[:, ::3] = False
    if n > 1:
        ym = softdot.softmax(x, where=keep)
        assert np.all(ym[~keep].astype(np.float32) == 0)
        xs = x[:, keep[0]]
        assert np.array_equal(ym[:, keep[0]].view(np.uint16), softdot.softmax(xs).view(np.uint16))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_out_and_in_place(name, dt, tdt):
    x = logits((5, 300), dt)
    want = softdot.softmax(x)
    out = np.empty_like(x)
    r = softdot.softmax(x, out=out)
    assert r is out and np.array_equal(out.view(np.uint16), want.view(np.uint16))
    softdot.softmax(x, out=x)
    assert np.array_equal(x.view(np.uint16), want.view(np.uint16))
    with pytest.raises(TypeError):
        softdot.softmax(logits((5, 300), dt), out=np.empty((5, 300), np.float32))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_overlapping_out_is_refused(name, dt, tdt):
    """As for float32: out is the input itself (in place) or shares no element
    with it; any other overlap (shifted, transposed, out inside x) is a
    ValueError naming out and the input, and the refused call writes nothing.
    (The 16-bit path copies its inputs, so it could compute these, but the
    same call must not pass or fail with the dtype.)"""
    buf = logits((1, 13), dt)[0]
    keep = buf.view(np.uint16).copy()
    for name_, call in [
        ("x", lambda: softdot.softmax(buf[:12], out=buf[1:])),
        ("x", lambda: softdot.log_softmax(buf[:12], out=buf[1:])),
        ("x", lambda: softdot.logsumexp(buf[:12].reshape(3, 4), axis=1, out=buf[:3])),
        ("dy", lambda: softdot.softmax_backward(np.ones(6, dt), buf[:6], out=buf[1:7])),
        ("y", lambda: softdot.softmax_backward(buf[:6], np.ones(6, dt), out=buf[1:7])),
    ]:
        with pytest.raises(ValueError, match=f"out overlaps {name_}"):
            call()
        assert np.array_equal(buf.view(np.uint16), keep)
    sq = logits((4, 4), dt)
    with pytest.raises(ValueError, match="out overlaps x"):
        softdot.softmax(sq, out=sq.T)
    t = torch.from_numpy(logits((4, 4), np.float32)).to(tdt)
    with pytest.raises(ValueError, match="out overlaps x"):
        softdot.softmax(t, out=t.T)
    # Interleaved (no shared element) and in place stay allowed.
    two = logits((8, 2), dt)
    want = softdot.softmax(two[:, 0].copy())
    softdot.softmax(two[:, 0], out=two[:, 1])
    assert np.array_equal(two[:, 1].view(np.uint16), want.view(np.uint16))
    y = softdot.softmax(logits((2, 9), dt))
    dy = logits((2, 9), dt)
    want = softdot.softmax_backward(y, dy)
    softdot.softmax_backward(y, dy, out=dy)
    assert np.array_equal(dy.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_special_values(name, dt, tdt):
    inf, nan = np.inf, np.nan
    x = np.array([[1.0, -inf, 2.0], [-inf, -inf, -inf], [inf, 0.0, inf], [1.0, nan, 0.0]], dt)
    y = softdot.softmax(x).astype(np.float64)
    assert y[0, 1] == 0 and y[1].tolist() == [0, 0, 0]
    assert y[2, 1] == 0 and y[2, 0] == 0.5 and y[2, 2] == 0.5
    assert np.all(np.isnan(y[3]))
    lse = softdot.logsumexp(x, axis=-1).astype(np.float64)
    assert lse[1] == -inf and lse[2] == inf and np.isnan(lse[3])
    ly = softdot.log_softmax(x).astype(np.float64)
    assert np.all(ly[1] == -inf)


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_softmax_backward(name, dt, tdt):
    x = logits((4, 500), dt, seed=3)
    y = softdot.softmax(x)
    dy = logits((4, 500), dt, seed=4, scale=1.0)
    dx = softdot.softmax_backward(y, dy)
    assert dx.dtype == dt
    yd, dd = y.astype(np.float64), dy.astype(np.float64)
    ref = yd * (dd - (yd * dd).sum(axis=-1, keepdims=True))
    assert ulp_misses(dx, ref, dt) <= 2
    yt = torch.from_numpy(y.view(np.int16)).view(tdt)
    dyt = torch.from_numpy(dy.view(np.int16)).view(tdt)
    dxt = softdot.softmax_backward(yt, dyt)
    assert dxt.dtype == tdt
    assert np.array_equal(dxt.view(torch.int16).numpy(), dx.view(np.int16))
    with pytest.raises(TypeError):
        softdot.softmax_backward(y, dy.astype(np.float32))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(name, dt, tdt, reduction):
    x = logits((6, 257), dt, seed=5)
    t = np.array([0, 5, 256, -100, 7, 100])
    loss, g = softdot.cross_entropy(x, t, reduction=reduction, grad=True, label_smoothing=0.1)
    assert g.dtype == dt
    xd = x.astype(np.float64)
    lse = np.log(np.exp(xd - xd.max(1, keepdims=True)).sum(1)) + xd.max(1)
    keep = t != -100
    tt = np.where(keep, t, 0)
    rows = 0.9 * (lse - xd[np.arange(6), tt]) + 0.1 * (lse - xd.mean(1))
    rows[~keep] = 0
    if reduction == "none":
        assert loss.dtype == dt
        assert ulp_misses(loss, rows, dt) == 0
    else:
        ref = rows.sum() / (keep.sum() if reduction == "mean" else 1)
        assert ulp_misses(np.asarray(loss), np.asarray(ref), dt) == 0
    p = np.exp(xd - lse[:, None])
    c = 1.0 / keep.sum() if reduction == "mean" else 1.0
    gref = c * (p - 0.9 * np.eye(257)[tt] - 0.1 / 257)
    gref[~keep] = 0
    assert ulp_misses(g, gref, dt) <= 2
    xt = torch.from_numpy(x.view(np.int16)).view(tdt)
    lt, gt = softdot.cross_entropy(
        xt, torch.from_numpy(t), reduction=reduction, grad=True, label_smoothing=0.1
    )
    assert gt.dtype == tdt and lt.dtype == tdt
    assert np.array_equal(gt.view(torch.int16).numpy(), g.view(np.int16))


def test_other_dtypes_still_refused():
    with pytest.raises(TypeError):
        softdot.softmax(np.zeros(4, ml_dtypes.float8_e4m3fn))
    x = torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(NotImplementedError):
        softdot.softmax(x)


def test_void2_npy_reads_as_bfloat16(tmp_path):
    """np.save of an ml_dtypes.bfloat16 array writes '<V2'; np.load gives a
    void array back. softdot reads it as bfloat16 (as the command does) and
    returns the same void dtype."""
    x = logits((3, 50), np.dtype(ml_dtypes.bfloat16), seed=9)
    np.save(tmp_path / "x.npy", x)
    v = np.load(tmp_path / "x.npy")
    assert v.dtype.kind == "V"
    y = softdot.softmax(v)
    assert y.dtype == v.dtype
    assert np.array_equal(y.view(np.uint16), softdot.softmax(x).view(np.uint16))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_cross_entropy_autograd_16bit(name, dt, tdt):
    """On a 16-bit tensor that requires grad, cross_entropy goes through the
    autograd Function: its backward (incoming gradient 1) gives the bits of
    grad=True."""
    x = torch.from_numpy(logits((4, 33), dt, seed=8).view(np.int16)).view(tdt)
    t = torch.tensor([0, 5, 32, 7])
    xg = x.clone().requires_grad_(True)
    loss = softdot.cross_entropy(xg, t)
    assert loss.dtype == tdt and loss.grad_fn is not None
    loss.backward()
    want_loss, want_g = softdot.cross_entropy(x, t, grad=True)
    assert torch.equal(loss.detach().view(torch.int16), want_loss.view(torch.int16))
    assert torch.equal(xg.grad.view(torch.int16), want_g.view(torch.int16))


@pytest.mark.parametrize("name,dt,tdt", FORMATS)
def test_precision_fast(name, dt, tdt):
    """precision="fast": the float weight rounded once, so a miss is a
    neighbour of the correctly rounded value with the exact weight within
    2^-21 relative of the midpoint between them; special rows as the
    default precision, bit for bit."""
    for x, t, keep in (
        (logits((64, 1000), dt), 1.0, None),
        (logits((3, 40000), dt, seed=5), 0.7, np.arange(40000) % 3 != 0),
    ):
        w, _, _ = ref_softmax(np.where(keep, x, -np.inf) if keep is not None else x, t)
        y = softdot.softmax(x, temperature=t, where=keep, precision="fast")
        assert y.dtype == dt
        ulp_misses(y, w, dt)  # every miss a neighbour
        want = rounded(w, dt)
        miss = y.view(np.uint16) != want.view(np.uint16)
        mid = (y[miss].astype(np.float64) + want[miss].astype(np.float64)) / 2
        assert np.all(np.abs(w[miss] - mid) < 2.0**-21 * w[miss])
        xt = torch.from_numpy(x.view(np.int16)).view(tdt)
        kt = None if keep is None else torch.from_numpy(np.broadcast_to(keep, x.shape).copy())
        yt = softdot.softmax(xt, temperature=t, where=kt, precision="fast")
        assert np.array_equal(yt.view(torch.int16).numpy(), y.view(np.int16))
    inf, nan = np.inf, np.nan
    s = np.array([[1.0, -inf, 2.0], [-inf, -inf, -inf], [inf, 0.0, inf], [1.0, nan, 0.0]], dt)
    for t in (1.0, 1e-30):
        a = softdot.softmax(s, temperature=t)
        b = softdot.softmax(s, temperature=t, precision="fast")
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
