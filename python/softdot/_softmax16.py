"""The softmax family on 16-bit inputs: torch.bfloat16 / torch.float16
tensors and numpy ml_dtypes.bfloat16 / float16 arrays. The values travel to
the core as their bits (uint16 views, no copy of a row-major input) and come
back in the input's dtype, each result rounded once from float / double
(include/softdot/softmax.h, "16-bit rows"). softmax, log_softmax, logsumexp,
softmax_backward and cross_entropy call these when their input is 16-bit."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays as A
from . import _rowops as R
from . import _softdot as _core

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


def info(x: Any) -> Optional[Tuple[str, bool, Any]]:
    """(kind, bf16, dtype) when x is a 16-bit float tensor or array, else None."""
    t = type(x)
    if t is np.ndarray:
        d = x.dtype
        if d == A.F16:
            return "numpy", False, d
        if d.name == "bfloat16":  # ml_dtypes.bfloat16
            return "numpy", True, d
        if d.kind == "V" and d.itemsize == 2 and d.fields is None:
            # np.load of a file ml_dtypes' np.save wrote ('<V2'): bfloat16
            # bits, read as the command reads them (docs/cli.md)
            return "numpy", True, d
        return None
    if A.is_torch(x):
        torch = A.torch_module()
        if x.dtype == torch.bfloat16:
            return "torch", True, x.dtype
        if x.dtype == torch.float16:
            return "torch", False, x.dtype
    return None


def bits(fn: str, name: str, x: Any, kind: str) -> np.ndarray:
    """The uint16 view of a 16-bit tensor's or array's memory."""
    if kind == "torch":
        torch = A.torch_module()
        A.check_device(fn, name, x)
        if x.requires_grad:
            if torch.is_grad_enabled():
                raise NotImplementedError(
                    f"{fn}: {name} is a {x.dtype} tensor that requires grad; softdot's autograd "
                    f"Functions take float32 / float64. Call it under torch.no_grad() or on a "
                    f"detached tensor"
                )
            x = x.detach()
        return x.view(torch.int16).numpy().view(A.U16)
    return x.view(A.U16)


def _same(fn: str, name: str, a: Any, kind: str, dtype: Any) -> np.ndarray:
    """A second 16-bit operand of the main input's library and dtype, as bits."""
    inf = info(a)
    if inf is None or inf[0] != kind or inf[2] != dtype:
        raise TypeError(f"{fn}: {name} has dtype {A.dtype_str(a)}; expected {dtype} (as the input)")
    return bits(fn, name, a, kind)


def new(shape: Tuple[int, ...], dtype: Any, kind: str) -> Tuple[Any, np.ndarray]:
    """(a new tensor or array of dtype, its uint16 view)."""
    if kind == "torch":
        torch = A.torch_module()
        t = torch.empty(shape, dtype=dtype)
        return t, t.view(torch.int16).numpy().view(A.U16)
    a = np.empty(shape, dtype=dtype)
    return a, a.view(A.U16)


def output(fn: str, out: Any, shape: Tuple[int, ...], dtype: Any, kind: str):
    """(what the caller gets, the uint16 view written)."""
    if out is None:
        return new(shape, dtype, kind)
    if kind == "torch":
        if not A.is_torch(out):
            raise TypeError(f"{fn}: out must be a torch.Tensor when the input is one")
        if out.requires_grad:
            raise ValueError(f"{fn}: out requires grad; pass a tensor without autograd history")
    elif type(out) is not np.ndarray:
        raise TypeError(f"{fn}: out must be a numpy.ndarray when the input is one")
    inf = info(out)
    if inf is None or inf[2] != dtype:
        raise TypeError(f"{fn}: out has dtype {A.dtype_str(out)}; expected {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{fn}: out has shape {tuple(out.shape)}; expected {tuple(shape)}")
    if kind == "numpy" and not out.flags.writeable:
        raise ValueError(f"{fn}: out is read-only")
    return out, bits(fn, "out", out, kind)


def scale_check(fn: str, temperature: Any) -> float:
    """The temperature, checked; its reciprocal must be a finite, non-zero
    float32 (the 16-bit functions multiply by 1 / T rounded to float)."""
    return R.temperature_value(fn, temperature, A.F32)


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    """a (last axis the row) as a 2-d (rows, n) array: a view of a row-major
    a, else a contiguous copy."""
    return np.ascontiguousarray(a).reshape(-1, n)


def _write(om: np.ndarray, n: int, call) -> None:
    """call(o2) with o2 a (rows, n) view of om when it is contiguous, else a
    scratch array copied into om afterwards."""
    if om.flags.c_contiguous:
        call(om.reshape(-1, n))
        return
    tmp = np.empty(om.shape, dtype=om.dtype)
    call(tmp.reshape(-1, n))
    om[...] = tmp


def row_op(
    fn: str,
    x: Any,
    axis: Any,
    where: Any,
    temperature: Any,
    out: Any,
    log: bool,
    fast: bool = False,
) -> Any:
    kind, bf16, dtype = info(x)  # type: ignore[misc]
    xb = bits(fn, "x", x, kind)
    ax = A.softmax_axis(fn, "x", xb.shape, axis, "a softmax")
    t = scale_check(fn, temperature)
    w = None if where is None else R.where_of(fn, where, xb.shape, kind)
    user, ob = output(fn, out, xb.shape, dtype, kind)
    if out is not None:  # as the float32 path: out is x itself or shares nothing
        A.check_overlap(fn, ob, "x", xb, True)
        A.check_overlap(fn, ob, "where", w, False)
    if xb.size == 0:
        return user
    n = xb.shape[ax]
    xm, om = np.moveaxis(xb, ax, -1), np.moveaxis(ob, ax, -1)
    x2 = _rows(xm, n)
    w2 = None if w is None else np.ascontiguousarray(np.moveaxis(w, ax, -1)).reshape(-1, n)
    _write(om, n, lambda o2: _core.softmax16_rows(x2, o2, w2, log, t, bf16, fast))
    return user


def round_bits(value: float, bf16: bool) -> int:
    """The 16-bit pattern of a double rounded once (round to odd to float32,
    then to 16 bits)."""
    f = np.float32(value)
    if math.isfinite(value) and float(f) != value:
        u = int(np.array(f).view(np.uint32))
        if abs(float(f)) > abs(value):
            u -= 1
        u |= 1
        f = np.array(u, dtype=np.uint32).view(np.float32)[()]
    if not bf16:
        return int(np.array(np.float16(f)).view(np.uint16))
    u = int(np.array(f).view(np.uint32))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def scalar(value: float, bf16: bool, dtype: Any, kind: str) -> Any:
    """value rounded once to the 16-bit dtype: a 0-d tensor or a numpy scalar."""
    b = np.array(round_bits(value, bf16), dtype=A.U16)
    if kind == "torch":
        torch = A.torch_module()
        return torch.from_numpy(b.view(np.int16).reshape(())).view(dtype).clone()
    return b.view(dtype)[()]


def logsumexp(
    fn: str,
    x: Any,
    axis: Union[None, int, Sequence[int]],
    where: Any,
    temperature: Any,
    keepdims: bool,
    out: Any,
) -> Any:
    kind, bf16, dtype = info(x)  # type: ignore[misc]
    xb = bits(fn, "x", x, kind)
    nd = xb.ndim
    axes = A.reduced_axes(fn, axis, nd)
    if nd == 0:
        xb = xb.reshape(1)
        nd = 1
    zero_d = len(x.shape) == 0
    res_shape = tuple(s for i, s in enumerate(xb.shape) if i not in axes)
    keep_shape = tuple(1 if i in axes else s for i, s in enumerate(xb.shape))
    if zero_d:
        res_shape, keep_shape = (), ()
    t = scale_check(fn, temperature)
    n = 1
    for a in axes:
        n *= xb.shape[a]
    if n == 0:
        raise ValueError(f"{fn}: x has shape {xb.shape}: the reduced axes {axes} hold no entry")
    w = None if where is None else R.where_of(fn, where, tuple(x.shape), kind)
    if w is not None and zero_d:
        w = w.reshape(1)
    shape = keep_shape if keepdims else res_shape
    user, ob = output(fn, out, shape, dtype, kind)
    if out is not None:
        A.check_overlap(fn, ob, "x", xb, False)
        A.check_overlap(fn, ob, "where", w, False)
    order = [i for i in range(nd) if i not in axes] + list(axes)
    rows_shape = tuple(s for i, s in enumerate(xb.shape) if i not in axes) + (n,)

    def rows_of(a: np.ndarray) -> np.ndarray:
        if order != list(range(nd)):
            a = np.transpose(a, order)
        return np.ascontiguousarray(a.reshape(rows_shape)).reshape(-1, n)

    x2 = rows_of(xb)
    w2 = None if w is None else rows_of(w)
    r = np.empty(x2.shape[0], dtype=A.U16)
    _core.logsumexp16_rows(x2, r, w2, t, bf16)
    ob[...] = r.reshape(ob.shape)
    if kind == "numpy" and out is None and ob.ndim == 0:
        return user[()]
    return user


def softmax_backward(fn: str, y: Any, dy: Any, axis: Any, out: Any) -> Any:
    kind, bf16, dtype = info(y)  # type: ignore[misc]
    yb = bits(fn, "y", y, kind)
    if kind == "torch" and not A.is_torch(dy):
        raise TypeError(f"{fn}: dy must be a torch.Tensor when the main input is one")
    if kind == "numpy" and A.is_torch(dy):
        raise TypeError(f"{fn}: dy is a torch.Tensor but the main input is a numpy array")
    db = _same(fn, "dy", dy if kind == "torch" else np.asarray(dy), kind, dtype)
    if yb.shape != db.shape:
        raise ValueError(f"{fn}: y has shape {yb.shape} but dy has shape {db.shape}")
    ax = A.softmax_axis(fn, "y", yb.shape, axis, "a softmax gradient")
    user, ob = output(fn, out, yb.shape, dtype, kind)
    if out is not None:  # out may be y or dy itself, and share nothing else
        A.check_overlap(fn, ob, "y", yb, True)
        A.check_overlap(fn, ob, "dy", db, True)
    if yb.size == 0:
        return user
    n = yb.shape[ax]
    y2 = np.ascontiguousarray(np.moveaxis(yb, ax, -1)).reshape(-1, n)
    d2 = np.ascontiguousarray(np.moveaxis(db, ax, -1)).reshape(-1, n)
    if out is not None:  # out may be y or dy: read them first
        y2, d2 = y2.copy(), d2.copy()
    _write(np.moveaxis(ob, ax, -1), n, lambda o2: _core.softmax16_backward_rows(y2, d2, o2, bf16))
    return user


def cross_entropy(
    fn: str,
    logits: Any,
    t: np.ndarray,
    ignore_index: int,
    eps: float,
    reduction: str,
    grad: bool,
) -> Any:
    """The 16-bit cross-entropy; targets already int64 and shape-checked
    against logits' rows by the caller (_cross_entropy.py)."""
    kind, bf16, dtype = info(logits)  # type: ignore[misc]
    xb = bits(fn, "logits", logits, kind)
    single = xb.ndim == 1
    if single:
        xb, t = xb.reshape(1, -1), t.reshape(1)
    x2 = np.ascontiguousarray(xb)
    n = x2.shape[0]
    loss_user: Any = None
    loss_view: Optional[np.ndarray] = None
    if reduction == "none":
        loss_user, loss_view = new((n,), dtype, kind)
    grad_user: Any = None
    grad_view: Optional[np.ndarray] = None
    if grad:
        grad_user, grad_view = new(x2.shape, dtype, kind)
    value = _core.cross_entropy16_rows(
        x2, t, loss_view, grad_view, int(ignore_index), eps, REDUCTIONS[reduction], bf16
    )
    if reduction == "none":
        loss = loss_user.reshape(()) if single else loss_user
    else:
        loss = scalar(value, bf16, dtype, kind)
    if not grad:
        return loss
    return loss, (grad_user.reshape(-1) if single else grad_user)
