"""softdot.dask: softmax, log_softmax and logsumexp of dask arrays along an
axis that is split into chunks (docs/python.md, "Dask arrays").

Each chunk along the axis gives one softmax state per row (its max and a
double-double sum of exp(x_i - max), :func:`softdot.softmax_state`); the
states of a row are merged in a balanced binary tree whose shape depends only
on the number of chunks along the axis (chunks 0+1, 2+3, ..., then the pairs
of those, an odd one carried up unchanged), with :meth:`SoftmaxState.merge`;
each chunk is then written from the row's total state
(:func:`softdot.softmax_apply`). The result is the same bits for the same
chunking on any scheduler, threads or worker processes.

Bounds against the in-memory functions (:func:`softdot.softmax` and the
others on the whole array), for the same ``where`` and ``temperature``:

- one chunk along the axis: each block is the in-memory function of that
  block, so the result is bitwise the in-memory one;
- softmax: every weight within 1 ulp of the exact weight, as the in-memory
  softmax (default precision), so the two differ by at most 1 ulp;
- logsumexp: the in-memory algorithm over chunks: the logsumexp of the
  merged state (within 1 ulp), and where that cancels (m < 0 and
  |lse| < |m|, as for log-probabilities) a second pass summing
  exp(x_i s - m) over the chunks in the next wider type: within 2 ulp plus
  about u_W |m| (u_W = 2^-53 for float32, 2^-64 for float64 on x86);
- log_softmax: ``(x_i / T - max) - log(sum)`` from the merged state, formed
  in double for float32 and in long double (x86 80-bit, or quad) for float64
  and rounded once: within 1 ulp of the exact value everywhere (more
  accurate than the in-memory bound of 1 ulp for ``|y| >= 1`` and 2^-23 /
  2^-52 absolute below), so within 1 ulp of the in-memory log_softmax where
  ``|y| >= 1`` and within 2^-23 / 2^-52 + 1 ulp below.

Special values are those of the in-memory functions: excluded (``where``
False) or -inf entries get weight 0 (log-weight -inf), a row excluded in
every chunk gives zeros (log-weights and logsumexp -inf), an excluded chunk
is the identity of the merge, k entries of +inf share the weight (1/k), and a
NaN that ``where`` keeps, in any chunk, makes the whole row NaN.

dask is an optional dependency of softdot: ``pip install "dask[array]"``
(and ``distributed`` for a cluster).
"""

from __future__ import annotations

import functools
import math
from typing import Any, List

import numpy as np

try:
    import dask.array as da
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "softdot.dask needs dask's array module: pip install 'dask[array]' "
        "(and 'distributed' to run on a cluster)"
    ) from e

from . import _softdot as _core
from ._rowops import temperature_value
from ._softmax import log_softmax as _log_softmax_np
from ._softmax import logsumexp as _logsumexp_np
from ._softmax import softmax as _softmax_np

__all__ = ["softmax", "log_softmax", "logsumexp"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
# The wide type of log_softmax for float64 rows (x86 80-bit or IEEE quad).
_WIDE = np.longdouble if np.finfo(np.longdouble).nmant >= 63 else None


# ---- checks (at graph construction, on the caller's thread) ------------------


def _float_input(fn: str, x: Any) -> "da.Array":
    if not isinstance(x, da.Array):
        x = da.asarray(x)
    d = x.dtype
    if d == _F32 or d == _F64:
        return x if d.isnative else x.astype(d.newbyteorder("="))
    if d.kind in "iub":
        return x.astype(_F64)
    raise TypeError(
        f"{fn}: x has dtype {d}; expected float32 or float64 (integers and "
        f"booleans are converted to float64)"
    )


def _axis(fn: str, axis: Any, nd: int) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{fn}: axis must be an int, not {axis!r}")
    a = int(axis)
    if not -nd <= a < nd:
        raise ValueError(f"{fn}: axis {a} is out of range for x with {nd} axes")
    return a % nd


def _where(fn: str, where: Any, x: "da.Array") -> "da.Array":
    """where as booleans broadcast to x's shape and chunked as x."""
    w = where if isinstance(where, da.Array) else da.asarray(np.asarray(where))
    if w.dtype != np.bool_:
        raise TypeError(f"{fn}: where has dtype {w.dtype.name}; it must be boolean")
    try:
        ok = np.broadcast_shapes(w.shape, x.shape) == x.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{fn}: where has shape {tuple(w.shape)}, which does not broadcast to x's "
            f"shape {tuple(x.shape)}"
        )
    if w.shape != x.shape:
        w = da.broadcast_to(w, x.shape)
    return w.rechunk(x.chunks)


def _prepare(fn: str, x: Any, axis: Any, where: Any, temperature: Any):
    """(x, where) with the axis moved last (where None or chunked as x), the
    axis, and the checked temperature."""
    xa = _float_input(fn, x)
    nd = xa.ndim
    if nd == 0:
        raise ValueError(f"{fn}: x is 0-d; a softmax needs at least one axis")
    ax = _axis(fn, axis, nd)
    if any(math.isnan(s) for s in xa.shape):
        raise ValueError(f"{fn}: x has unknown chunk sizes {xa.shape}; call compute_chunk_sizes()")
    if xa.shape[ax] == 0:
        raise ValueError(f"{fn}: x has shape {xa.shape}: axis {ax} is empty")
    t = temperature_value(fn, temperature, xa.dtype)
    w = None if where is None else _where(fn, where, xa)
    if ax != nd - 1:
        xa = da.moveaxis(xa, ax, -1)
        w = None if w is None else da.moveaxis(w, ax, -1)
    return xa, w, ax, t


# ---- block functions (run on the workers) ----------------------------------------


def _rows(b: np.ndarray) -> np.ndarray:
    """A block as a C-contiguous matrix of its rows (last axis)."""
    return np.ascontiguousarray(b).reshape(math.prod(b.shape[:-1]), b.shape[-1])


def _block_states(xb: np.ndarray, wb: Any = None, *, t: float) -> np.ndarray:
    """The state (max, sum, sum_lo) of every row of a block, as float64 [..., 3]."""
    xr = _rows(xb)
    wr = None if wb is None else _rows(wb)
    st = np.empty((xr.shape[0], 3), dtype=np.float64)
    for i in range(xr.shape[0]):
        st[i] = _core.state(xr[i], None if wr is None else wr[i], t)
    return st.reshape(xb.shape[:-1] + (3,))


def _merge_states(a: np.ndarray, b: np.ndarray, *, is_double: bool) -> np.ndarray:
    ar, br = a.reshape(-1, 3), b.reshape(-1, 3)
    out = np.empty_like(ar)
    for i in range(ar.shape[0]):
        out[i] = _core.merge(is_double, tuple(ar[i]), tuple(br[i]))
    return out.reshape(a.shape)


def _cancels(sr: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """Rows whose logsumexp m + log(sum) cancels (m < 0, |lse| < |m|): the
    in-memory logsumexp recomputes them in the next wider type."""
    m = sr[:, 0]
    with np.errstate(invalid="ignore"):
        return np.isfinite(lse) & (m < 0) & (np.abs(lse) < -m)


def _state_lse_rows(sr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    is_double = dtype == _F64
    return np.array([_core.state_logsumexp(is_double, tuple(r)) for r in sr], dtype=np.float64)


def _block_wide_sum(xb: np.ndarray, st: np.ndarray, wb: Any = None, *, t: float) -> np.ndarray:
    """For the rows whose logsumexp cancels: sum exp(x_i s - m) over the
    block, each exp in the next wider type (double for float32, long double
    for float64), the sum exact to 2^-106 as a double-double (hi, lo), as
    float64 [..., 2]; (0, 0) for the other rows."""
    dtype = xb.dtype
    W = np.float64 if dtype == _F32 else (_WIDE or np.float64)
    xr = _rows(xb)
    wr = None if wb is None else _rows(wb)
    sr = st.reshape(-1, 3)
    out = np.zeros((xr.shape[0], 2), dtype=np.float64)
    s = W(dtype.type(1.0 / t))
    for i in np.nonzero(_cancels(sr, _state_lse_rows(sr, dtype)))[0]:
        p = xr[i].astype(W) * s
        keep = p != -np.inf
        if wr is not None:
            keep &= wr[i]
        e = np.exp(p[keep] - W(dtype.type(sr[i, 0])))
        e1 = e.astype(np.float64)
        parts = np.concatenate([e1, (e - e1.astype(W)).astype(np.float64)])
        hi = math.fsum(parts)
        out[i] = hi, math.fsum(np.append(parts, -hi))
    return out.reshape(xb.shape[:-1] + (2,))


def _add_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(hi, lo) + (hi, lo), exact to 2^-106, row by row."""
    ar, br = a.reshape(-1, 2), b.reshape(-1, 2)
    out = np.empty_like(ar)
    for i in range(ar.shape[0]):
        v = (ar[i, 0], ar[i, 1], br[i, 0], br[i, 1])
        hi = math.fsum(v)
        out[i] = hi, math.fsum(v + (-hi,))
    return out.reshape(a.shape)


def _lse_final(st: np.ndarray, pair: np.ndarray, *, out_dtype: np.dtype) -> np.ndarray:
    """The state's logsumexp, or m + log1p((hi - 1) + lo) in the wider type
    where it cancels (the in-memory algorithm)."""
    sr, pr = st.reshape(-1, 3), pair.reshape(-1, 2)
    lse = _state_lse_rows(sr, out_dtype)
    out = lse.astype(out_dtype)
    W = np.float64 if out_dtype == _F32 else (_WIDE or np.float64)
    c = _cancels(sr, lse)
    if c.any():
        m = sr[c, 0].astype(out_dtype).astype(W)
        hi, lo = pr[c, 0].astype(W), pr[c, 1].astype(W)
        out[c] = (m + np.log1p((hi - 1) + lo)).astype(out_dtype)
    return out.reshape(st.shape[:-1])


def _block_apply(xb: np.ndarray, st: np.ndarray, wb: Any = None, *, t: float) -> np.ndarray:
    """The weights of a block given the total state of each of its rows."""
    xr = _rows(xb)
    wr = None if wb is None else _rows(wb)
    sr = st.reshape(-1, 3)
    out = np.empty_like(xr)
    for i in range(xr.shape[0]):
        _core.apply(xr[i], tuple(sr[i]), out[i], None if wr is None else wr[i], t)
    return out.reshape(xb.shape)


def _two_product_lo(a: np.ndarray, b: float) -> np.ndarray:
    """The exact error of fl(a * b) in float64 (Dekker's product, 0 where a
    split would overflow)."""
    split = 134217729.0  # 2^27 + 1
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b
        ca = split * a
        ahi = ca - (ca - a)
        alo = a - ahi
        cb = split * b
        bhi = cb - (cb - b)
        blo = b - bhi
        lo = ((ahi * bhi - p) + ahi * blo + alo * bhi) + alo * blo
    return np.where(np.isfinite(lo), lo, 0.0)


def _block_log_apply(xb: np.ndarray, st: np.ndarray, wb: Any = None, *, t: float) -> np.ndarray:
    """log_softmax of a block from the total states: (x_i s - max) - log(sum),
    in double (float32 rows) or long double (float64 rows), rounded once."""
    dtype = xb.dtype
    xr = _rows(xb)
    sr = st.reshape(-1, 3)
    s = dtype.type(1.0 / t)
    W = np.float64 if dtype == _F32 else (_WIDE or np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = sr[:, :1].astype(W)
        # The sum S = hi + lo >= 1 in a finite row (the max contributes 1);
        # L = log1p((hi - 1) + lo) keeps the digits of S - 1 when one entry
        # dominates (hi - 1 is exact there).
        hi, lo = sr[:, 1:2].astype(W), sr[:, 2:3].astype(W)
        big = hi + lo
        if dtype == _F32:
            p = xr.astype(np.float64) * np.float64(s)  # exact: 24 x 24 bits
            d = p - m
        elif s == 1:
            d = xr.astype(W) - m
        else:
            ph = xr * s
            d = (ph.astype(W) - m) + _two_product_lo(xr, float(s)).astype(W)
        L = np.log1p((hi - 1) + lo)
        y = np.minimum(d - L, 0)
        mf = sr[:, :1]
        # A row with no kept entry: all -inf. A row whose max is +inf: the k
        # +inf entries share the weight, log(1/k) each. A NaN row stays NaN.
        y = np.where(mf == -np.inf, -np.inf, y)
        if np.any(mf == np.inf):
            pinf = np.isposinf(xr * s)  # the product in x's dtype, as the library's
            y = np.where(mf == np.inf, np.where(pinf, 0.0 - np.log(big), -np.inf), y)
        if wb is not None:
            y = np.where(_rows(wb), y, -np.inf)
        y = np.where(np.isnan(mf), np.nan, y)  # excluded entries too, as in memory
        out = y.astype(dtype)
    return out.reshape(xb.shape)


def _whole_row(fn, xb, wb=None, *, t: float, **kw):
    """The in-memory function on a block that holds its rows whole."""
    return np.asarray(fn(xb, axis=-1, where=wb, temperature=t, **kw))


# ---- the graph ------------------------------------------------------------------


def _meta(nd: int, dtype: Any) -> np.ndarray:
    return np.empty((0,) * nd, dtype=dtype)


def _tree(blocks: "da.Array", merge, kw: dict, nd: int) -> "da.Array":
    """Merges the blocks along the last axis in a fixed balanced tree: blocks
    0+1, 2+3, ..., then the pairs of those, an odd one carried up as it is."""
    idx = (slice(None),) * (nd - 1)
    level: List[da.Array] = [blocks.blocks[idx + (j,)] for j in range(blocks.numblocks[-1])]
    while len(level) > 1:
        nxt = [
            da.map_blocks(
                merge,
                level[i],
                level[i + 1],
                **kw,
                dtype=np.float64,
                meta=_meta(nd, np.float64),
                token="softdot-merge",
            )
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _total_state(x: "da.Array", w: Any, t: float) -> "da.Array":
    """The merged state (max, sum, sum_lo) of every row of x (axis last):
    float64 [..., 3] in one chunk along the last axis."""
    nd = x.ndim
    args = [x] if w is None else [x, w]
    states = da.map_blocks(
        _block_states,
        *args,
        t=t,
        dtype=np.float64,
        chunks=x.chunks[:-1] + ((3,) * x.numblocks[-1],),
        meta=_meta(nd, np.float64),
        token="softdot-state",
    )
    return _tree(states, _merge_states, {"is_double": x.dtype == _F64}, nd)


def _per_chunk(
    block_fn,
    x: "da.Array",
    total: "da.Array",
    w: Any,
    t: float,
    token: str,
    dtype: Any = None,
    chunks: Any = None,
) -> "da.Array":
    """block_fn(x block, total state of its rows[, where block]) over x."""
    nd = x.ndim
    ind = tuple(range(nd))
    tind = ind[:-1] + (nd,)
    args: List[Any] = [x, ind, total, tind]
    if w is not None:
        args += [w, ind]
    dtype = x.dtype if dtype is None else dtype
    kw = {} if chunks is None else {"adjust_chunks": {nd - 1: chunks[-1]}}
    return da.blockwise(
        block_fn,
        ind,
        *args,
        t=t,
        dtype=dtype,
        concatenate=True,
        meta=_meta(nd, dtype),
        token=token,
        **kw,
    )


def _softmax_like(fn: str, x, axis, where, temperature, log: bool):
    xa, w, ax, t = _prepare(fn, x, axis, where, temperature)
    nd = xa.ndim
    args = [xa] if w is None else [xa, w]
    if xa.numblocks[-1] == 1:
        inner = _log_softmax_np if log else _softmax_np
        y = da.map_blocks(
            functools.partial(_whole_row, inner),
            *args,
            t=t,
            dtype=xa.dtype,
            meta=_meta(nd, xa.dtype),
            token=f"softdot-{fn}",
        )
    else:
        total = _total_state(xa, w, t)
        y = _per_chunk(_block_log_apply if log else _block_apply, xa, total, w, t, f"softdot-{fn}")
    return y if ax == nd - 1 else da.moveaxis(y, -1, ax)


def softmax(
    x: Any, /, *, axis: int = -1, where: Any = None, temperature: float = 1.0
) -> "da.Array":
    """Softmax of a dask array along ``axis``, which may be split into any
    number of chunks (any chunking of the other axes too).

    Parameters
    ----------
    x : dask.array.Array or array_like
        float32 or float64 (integers and booleans become float64).
    axis : int, default -1
    where : dask or numpy array of bool, optional
        True keeps an entry; broadcast against ``x`` and chunked as ``x``.
    temperature : float, default 1.0
        Scores are multiplied by ``1 / temperature`` rounded to x's dtype.

    Returns
    -------
    dask.array.Array
        Lazy, of x's shape, dtype and chunks. Every weight within 1 ulp of the
        exact weight (bitwise the in-memory :func:`softdot.softmax` when the
        axis is one chunk). Special values as :func:`softdot.softmax`.
    """
    return _softmax_like("softmax", x, axis, where, temperature, False)


def log_softmax(
    x: Any, /, *, axis: int = -1, where: Any = None, temperature: float = 1.0
) -> "da.Array":
    """Log-softmax of a dask array along ``axis`` (chunked as for
    :func:`softmax`): ``x_i / T - logsumexp(x / T)`` from the row's merged
    state, formed in double (float32) or long double (float64) and rounded
    once, so within 1 ulp of the exact value; bitwise the in-memory
    :func:`softdot.log_softmax` when the axis is one chunk. Log-weights are
    never above 0; excluded entries get -inf."""
    return _softmax_like("log_softmax", x, axis, where, temperature, True)


def logsumexp(
    x: Any,
    /,
    *,
    axis: int = -1,
    where: Any = None,
    temperature: float = 1.0,
    keepdims: bool = False,
) -> "da.Array":
    """``log(sum(exp(x / T)))`` of a dask array along one ``axis`` (default the
    last, unlike the in-memory :func:`softdot.logsumexp`, which reduces every
    axis by default).

    Returns
    -------
    dask.array.Array
        x's dtype, x's shape without ``axis`` (length 1 with ``keepdims``),
        chunked as x along the other axes. The logsumexp of the merged state
        (within 1 ulp), recomputed in the next wider type over the chunks
        where it cancels, as in memory (2 ulp plus about u_W |m|, see the
        module's docstring); bitwise the in-memory one when the axis is one
        chunk. A row with no kept entry gives -inf.
    """
    fn = "logsumexp"
    xa, w, ax, t = _prepare(fn, x, axis, where, temperature)
    args = [xa] if w is None else [xa, w]
    if xa.numblocks[-1] == 1:
        r = da.map_blocks(
            functools.partial(_whole_row, _logsumexp_np),
            *args,
            t=t,
            dtype=xa.dtype,
            drop_axis=xa.ndim - 1,
            meta=_meta(xa.ndim - 1, xa.dtype),
            token="softdot-logsumexp",
        )
    else:
        # As in memory: the logsumexp of the merged state, and a second pass
        # in the wider type for the rows where it cancels.
        nd = xa.ndim
        total = _total_state(xa, w, t)
        pairs = _per_chunk(
            _block_wide_sum,
            xa,
            total,
            w,
            t,
            "softdot-lse-wide",
            dtype=np.float64,
            chunks=xa.chunks[:-1] + ((2,) * xa.numblocks[-1],),
        )
        pair = _tree(pairs, _add_pairs, {}, nd)
        ind = tuple(range(nd))
        r = da.blockwise(
            _lse_final,
            ind[:-1],
            total,
            ind,
            pair,
            ind[:-1] + (nd,),
            out_dtype=xa.dtype,
            dtype=xa.dtype,
            concatenate=True,
            meta=_meta(nd - 1, xa.dtype),
            token="softdot-logsumexp",
        )
    if keepdims:
        r = da.expand_dims(r, ax)
    return r
