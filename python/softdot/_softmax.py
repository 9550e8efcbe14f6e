"""The softmax family, the online (chunked) softmax state and the dot products,
for numpy arrays and CPU torch tensors. See docs/python.md."""

from __future__ import annotations

import importlib
import math
from typing import Any, Sequence, Tuple, Union

import numpy as np

from . import _arrays as A
from . import _rowops as R
from . import _softdot as _core
from . import _softmax16 as S16

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "softmax_backward",
    "softmax_state",
    "softmax_apply",
    "SoftmaxState",
    "dot",
    "dots",
]

_ndarray = np.ndarray


def softmax_backward(y: Any, dy: Any, /, *, axis: int = -1, out: Any = None) -> Any:
    """Gradient of the softmax: ``dx_i = y_i (dy_i - <dy, y>)`` along ``axis``.

    ``y`` is the softmax's output and ``dy`` the gradient of a loss with
    respect to it. The inner product is computed in twice the working
    precision and each ``dx_i`` is formed in higher precision, so ``dx`` is
    within about 1 ulp of the exact value for these ``y`` and ``dy``, up to
    the conditioning of ``dy_i - <dy, y>``. NaN and inf follow IEEE rules.

    Parameters
    ----------
    y, dy : array_like or torch.Tensor
        Same shape and dtype (float32, float64, float16 or bfloat16).
    axis : int, default -1
    out : array, optional
        May be ``y`` or ``dy`` (in place).

    Returns
    -------
    numpy.ndarray or torch.Tensor
    """
    if S16.info(y) is not None:
        return S16.softmax_backward("softmax_backward", y, dy, axis, out)
    return R.softmax_backward(y, dy, axis, out)


_F32, _F64 = A.F32, A.F64
_dot_fast = _core.dot_fast
_fast_call = R.fast_call

# Special values, shared by the docstrings of the softmax family.
_SPECIAL = """
    Special values (the C++ library's table; scipy and torch differ):

    - entries of -inf or with ``where`` False get weight exactly 0 and the rest
      are as if they were absent;
    - a row with every entry -inf or excluded gives weights +0.0 (log-weights
      -inf, logsumexp -inf); scipy.special.softmax and torch.softmax give NaN;
    - k entries of +inf share the weight: 1/k each, 0 elsewhere (the limit);
      scipy and torch give NaN;
    - any NaN that ``where`` keeps makes the whole row NaN (never hidden)."""


def _autograd() -> Any:
    """softdot.torch (the autograd Functions), imported on the first tensor
    that requires grad; it imports _rowops, never this module."""
    return importlib.import_module(".torch", __package__)


def softmax(
    x: Any,
    /,
    *,
    axis: int = -1,
    where: Any = None,
    temperature: float = 1.0,
    precision: str = "faithful",
    out: Any = None,
) -> Any:
    """Softmax along an axis: ``exp(x_i / T - m) / sum_j exp(x_j / T - m)``.

    Parameters
    ----------
    x : array_like or torch.Tensor
        float32 or float64 (integers and booleans are converted to float64);
        a torch tensor must be on the CPU.
    axis : int, default -1
        The axis along which the weights sum to 1 (negative counts from the end).
    where : array_like of bool, optional
        True keeps an entry, False excludes it (it gets weight exactly 0), as in
        numpy and jax. Broadcast against ``x``.
    temperature : float, default 1.0
        Scores are multiplied by ``1 / temperature`` (rounded to x's dtype)
        before the max is taken; finite and > 0.
    precision : {"faithful", "fast"}, default "faithful"
        "faithful": every weight within 1 ulp of the exact value (measured
        for float32 on FMA targets: 0.59 ulp on normal weights, 0.75 near
        2^-126; docs/accuracy.md). "fast": within 2 ulp with FMA (2.5 without),
        about twice as fast on rows in cache. bfloat16 / float16: "faithful" is
        correctly rounded unless the exact weight lies within 2^-29 relative
        of a 16-bit midpoint; "fast" rounds the float "fast" weight once
        (always within 1 16-bit ulp; docs/accuracy.md "16-bit softmax family").
    out : array, optional
        Where to write; same shape, dtype and library as ``x``. May be ``x``
        itself (in place); must not otherwise overlap it.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        The weights, in ``out`` when given, else a new array like ``x``.
    """
    # The common call (a row-major array, last axis, no options) goes straight
    # to the core's NumPy fast path: most of the binding's cost per call.
    if precision == "faithful" or precision == "fast":
        r = _fast_call(x, out, where, axis, temperature, False, precision == "fast")
        if r is not None:
            return r
    fn = "softmax"
    fast = R.precision_flag(fn, precision)
    if S16.info(x) is not None:  # bfloat16 / float16: rounded once from float or double
        return S16.row_op(fn, x, axis, where, temperature, out, False, fast)
    if out is None and where is None and R.needs_grad(x):
        return _autograd().softmax(x, dim=axis, temperature=temperature, precision=precision)
    return R.row_op(fn, x, axis, where, temperature, out, False, fast)


softmax.__doc__ = (softmax.__doc__ or "") + _SPECIAL


def log_softmax(
    x: Any, /, *, axis: int = -1, where: Any = None, temperature: float = 1.0, out: Any = None
) -> Any:
    """Log of the softmax along an axis: ``x_i / T - logsumexp(x / T)``.

    Computed as ``(x_i - m) - L`` with the exact error of ``x_i - m`` and a
    double-length ``L``: within 1 ulp where ``|y_i| >= 1``, and within 2^-23
    (float32) / 2^-52 (float64) absolute below (docs/accuracy.md). Log-weights
    are never above 0.

    Parameters
    ----------
    x : array_like or torch.Tensor
        float32 or float64 (integers are converted to float64).
    axis : int, default -1
    where : array_like of bool, optional
        True keeps an entry; excluded entries get -inf.
    temperature : float, default 1.0
    out : array, optional
        Same shape, dtype and library as ``x``; may be ``x`` (in place).

    Returns
    -------
    numpy.ndarray or torch.Tensor
    """
    r = _fast_call(x, out, where, axis, temperature, True, False)
    if r is not None:
        return r
    fn = "log_softmax"
    if S16.info(x) is not None:
        return S16.row_op(fn, x, axis, where, temperature, out, True)
    if out is None and where is None and R.needs_grad(x):
        return _autograd().log_softmax(x, dim=axis, temperature=temperature)
    return R.row_op(fn, x, axis, where, temperature, out, True, False)


log_softmax.__doc__ = (log_softmax.__doc__ or "") + _SPECIAL


def logsumexp(
    x: Any,
    /,
    *,
    axis: Union[None, int, Sequence[int]] = None,
    where: Any = None,
    temperature: float = 1.0,
    keepdims: bool = False,
    out: Any = None,
) -> Any:
    """``log(sum(exp(x / T)))`` over the given axes (all of them by default, as
    in scipy.special.logsumexp).

    Within 2 ulp: the sum is compensated, and where the result cancels
    (logsumexp of log-probabilities) it is recomputed in the next wider type.

    Parameters
    ----------
    x : array_like or torch.Tensor
        float32 or float64 (integers are converted to float64).
    axis : None, int or tuple of ints, default None
        The axes to reduce; None reduces the whole array.
    where : array_like of bool, optional
        True keeps an entry. A row with no entry kept gives -inf.
    temperature : float, default 1.0
    keepdims : bool, default False
        Keep the reduced axes with length 1.
    out : array, optional
        Same dtype and library as ``x``, the shape of the result.

    Returns
    -------
    numpy scalar, numpy.ndarray or torch.Tensor
        A numpy scalar when every axis is reduced without keepdims (as scipy).
    """
    fn = "logsumexp"
    if S16.info(x) is not None:
        return S16.logsumexp(fn, x, axis, where, temperature, keepdims, out)
    kind = A.kind_of(x)
    xa = A.float_input(fn, "x", x, kind, sixteen=True)
    nd = xa.ndim
    axes = A.reduced_axes(fn, axis, nd)
    if nd == 0:  # one entry, reduced like a 1-d array of one
        xa = xa.reshape(1)
        nd = 1
        res_shape: Tuple[int, ...] = ()
        keep_shape: Tuple[int, ...] = ()
    else:
        res_shape = tuple(s for i, s in enumerate(xa.shape) if i not in axes)
        keep_shape = tuple(1 if i in axes else s for i, s in enumerate(xa.shape))
    t = R.temperature_value(fn, temperature, xa.dtype)
    n = 1
    for a in axes:
        n *= xa.shape[a]
    if n == 0:
        raise ValueError(f"{fn}: x has shape {xa.shape}: the reduced axes {axes} hold no entry")
    w = None if where is None else R.where_of(fn, where, xa.shape, kind)
    user, o = A.output(fn, out, keep_shape if keepdims else res_shape, xa.dtype, kind)
    if out is not None:
        A.check_overlap(fn, o, "x", xa, False)
        A.check_overlap(fn, o, "where", w, False)
    if o.size == 0:  # no rows
        return A.result(user, o, kind, scalar_ok=out is None)
    # Reduced axes last, merged into one row (a copy only if they cannot be).
    order = [i for i in range(nd) if i not in axes] + list(axes)

    def rows_of(a):
        if order != list(range(nd)):
            a = np.transpose(a, order)
        return A.contiguous_rows(a.reshape(res_shape + (n,)))

    target = o
    if keepdims and keep_shape:
        target = np.squeeze(o, axis=axes)  # a view without the length-1 axes
    _core.logsumexp_rows(rows_of(xa), target, None if w is None else rows_of(w), t)
    return A.result(user, o, kind, scalar_ok=out is None)


# ---- online softmax ------------------------------------------------------------


class SoftmaxState:
    """The state of a softmax over the chunks of a row seen so far.

    ``max`` is the largest (scaled, kept) score, ``sum`` + ``sum_lo`` the sum
    of ``exp(x_i - max)`` as an unevaluated double-double pair. A chunk whose
    max is +inf stores the count of its +inf entries as the sum; a NaN makes
    max and sum NaN. States combine with :meth:`merge` (commutative bit for
    bit, associative to about 1e-19 relative) and :meth:`identity` is the
    state of an empty chunk.

    Attributes
    ----------
    max : float
    sum : float
    sum_lo : float
    dtype : numpy.dtype
        float32 or float64: the dtype of the chunks.
    """

    __slots__ = ("max", "sum", "sum_lo", "dtype")

    def __init__(self, max: float, sum: float, sum_lo: float = 0.0, dtype: Any = np.float32):
        self.max = float(max)
        self.sum = float(sum)
        self.sum_lo = float(sum_lo)
        self.dtype = np.dtype(dtype)
        if self.dtype != _F32 and self.dtype != _F64:
            raise TypeError(f"SoftmaxState: dtype must be float32 or float64, not {self.dtype}")

    @classmethod
    def identity(cls, dtype: Any = np.float32) -> "SoftmaxState":
        """The state of an empty chunk: max -inf, sum 0 (the identity of merge)."""
        return cls(-math.inf, 0.0, 0.0, dtype)

    def _tuple(self) -> Tuple[float, float, float]:
        return (self.max, self.sum, self.sum_lo)

    def merge(self, other: "SoftmaxState") -> "SoftmaxState":
        """The state of both chunks: ``m = max(m1, m2)``,
        ``s = s1 exp(m1 - m) + s2 exp(m2 - m)`` in double-double arithmetic."""
        if not isinstance(other, SoftmaxState):
            raise TypeError(
                f"SoftmaxState.merge: expected a SoftmaxState, got {type(other).__name__}"
            )
        if other.dtype != self.dtype:
            raise TypeError(
                f"SoftmaxState.merge: states of {self.dtype.name} and {other.dtype.name} chunks"
            )
        r = _core.merge(self.dtype == np.float64, self._tuple(), other._tuple())
        return SoftmaxState(*r, dtype=self.dtype)

    def logsumexp(self) -> float:
        """``max + log(sum + sum_lo)``: the logsumexp of everything seen."""
        return self.dtype.type(_core.state_logsumexp(self.dtype == np.float64, self._tuple()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SoftmaxState):
            return NotImplemented
        return self._tuple() == other._tuple() and self.dtype == other.dtype

    def __repr__(self) -> str:
        return (
            f"SoftmaxState(max={self.max!r}, sum={self.sum!r}, sum_lo={self.sum_lo!r}, "
            f"dtype={self.dtype.name})"
        )


def _chunk(fn: str, chunk: Any, where: Any):
    kind = A.kind_of(chunk)
    c = A.float_input(fn, "chunk", chunk, kind)
    if c.ndim != 1:
        raise ValueError(f"{fn}: chunk has shape {c.shape}; expected a 1-d array")
    c = A.contiguous_rows(c)
    w = None
    if where is not None:
        w = A.contiguous_rows(R.where_of(fn, where, c.shape, kind))
    return c, w, kind


def softmax_state(chunk: Any, /, *, where: Any = None, temperature: float = 1.0) -> SoftmaxState:
    """State of one chunk of a row (which may be empty), for the online softmax.

    Examples
    --------
    >>> a, b = np.array([1002., 1000.]), np.array([997.])
    >>> s = softmax_state(a).merge(softmax_state(b))
    >>> softmax_apply(a, s), softmax_apply(b, s)   # the weights of the whole row
    """
    fn = "softmax_state"
    c, w, _ = _chunk(fn, chunk, where)
    t = R.temperature_value(fn, temperature, c.dtype)
    return SoftmaxState(*_core.state(c, w, t), dtype=c.dtype)


def softmax_apply(
    chunk: Any,
    total: SoftmaxState,
    /,
    *,
    where: Any = None,
    temperature: float = 1.0,
    out: Any = None,
) -> Any:
    """Final weights of one chunk, ``exp(x_i - total.max) / total.sum``, given the
    state of the whole row (which must include this chunk). Same ``where`` and
    ``temperature`` as the chunk's :func:`softmax_state`; ``out`` may be the
    chunk (in place)."""
    fn = "softmax_apply"
    if not isinstance(total, SoftmaxState):
        raise TypeError(f"{fn}: total must be a SoftmaxState, got {type(total).__name__}")
    c, w, kind = _chunk(fn, chunk, where)
    if c.dtype != total.dtype:
        raise TypeError(
            f"{fn}: chunk has dtype {c.dtype.name} but total is a state of "
            f"{total.dtype.name} chunks"
        )
    t = R.temperature_value(fn, temperature, c.dtype)
    user, o = A.output(fn, out, c.shape, c.dtype, kind)
    if out is not None:
        A.check_overlap(fn, o, "chunk", c, True)
    A.write_through(o, lambda target: _core.apply(c, total._tuple(), target, w, t))
    return user


# ---- dot products -----------------------------------------------------------------


def _operands(
    fn: str, first: Tuple[str, Any], second: Tuple[str, Any], ndims: Tuple[int, int], form: str
) -> Tuple[str, np.ndarray, np.ndarray]:
    """(kind, a, b): the (name, array) pairs of dot and dots as float inputs
    of the first one's library, with ndims axes (else ValueError ending in
    `form`) and one dtype (else TypeError)."""
    kind = A.kind_of(first[1])
    a = A.float_input(fn, first[0], first[1], kind)
    b = A.float_input(fn, second[0], A.secondary(fn, second[0], second[1], kind), kind)
    if (a.ndim, b.ndim) != ndims:
        raise ValueError(
            f"{fn}: {first[0]} has shape {a.shape} and {second[0]} has shape {b.shape}; {form}"
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"{fn}: {first[0]} has dtype {a.dtype.name} but {second[0]} has dtype {b.dtype.name}"
        )
    return kind, a, b


def dot(x: Any, y: Any, /, *, accurate: bool = False) -> Any:
    """Dot product of two 1-d arrays of the same dtype.

    ``accurate=False``: 8 accumulators of one 64-byte block each, fused
    multiply-adds, lanes added in a fixed tree; the same bits on every FMA
    target; ``|error| <= gamma_n sum |x_i y_i|``. ``accurate=True``: as if
    computed in twice the working precision and rounded once.

    Returns
    -------
    numpy.float32 / numpy.float64, or a 0-d torch.Tensor for torch inputs.
    """
    if type(x) is _ndarray and type(y) is _ndarray:
        r = _dot_fast(x, y, bool(accurate))
        if r is not None:
            return r
    fn = "dot"
    kind, xa, ya = _operands(fn, ("x", x), ("y", y), (1, 1), "both must be 1-d")
    if xa.shape != ya.shape:
        raise ValueError(f"{fn}: x has shape {xa.shape} but y has shape {ya.shape}")
    r = _core.dot(A.contiguous_rows(xa), A.contiguous_rows(ya), bool(accurate))
    return A.wrap_scalar(r, xa.dtype, kind)


def dots(query: Any, keys: Any, /, *, out: Any = None) -> Any:
    """Scores of one query against the rows of a key matrix:
    ``out[r] = dot(query, keys[r])``, bitwise equal to :func:`dot` per row.

    Parameters
    ----------
    query : 1-d array, length d
    keys : 2-d array [n, d]; any row stride (its rows must be contiguous,
        else they are copied)
    out : 1-d array [n], optional

    Returns
    -------
    numpy.ndarray or torch.Tensor of shape [n]
    """
    fn = "dots"
    kind, q, k = _operands(fn, ("query", query), ("keys", keys), (1, 2), "expected [d] and [n, d]")
    if k.shape[1] != q.shape[0]:
        raise ValueError(
            f"{fn}: keys has shape {k.shape} but query has shape {q.shape} "
            f"(keys.shape[1] must equal len(query))"
        )
    q, k = A.contiguous_rows(q), A.contiguous_rows(k)
    if k.shape[0] > 1 and k.strides[0] < k.shape[1] * k.itemsize:
        k = np.ascontiguousarray(k)
    n = k.shape[0]
    user, o = A.output(fn, out, (n,), q.dtype, kind)
    if out is not None:
        A.check_overlap(fn, o, "query", q, False)
        A.check_overlap(fn, o, "keys", k, False)
    A.write_through(o, lambda target: _core.dots(q, k, target))
    return user
