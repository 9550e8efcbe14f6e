"""The row operations under the softmax family, without autograd: argument
checks (precision, temperature, where), softmax / log_softmax along an axis,
and the softmax gradient. Both the public functions (_softmax.py) and the
autograd Functions (torch.py) call these, so neither imports the other at
module level: _softmax imports softdot.torch only when a tensor requires
grad, and softdot.torch imports only this module."""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Optional

import numpy as np

from . import _arrays as A
from . import _softdot as _core

PRECISIONS = {"faithful": False, "fast": True}

_ndarray = np.ndarray
_sys_modules = sys.modules
_softmax_fast = _core.softmax_fast


def precision_flag(fn: str, precision: Any) -> bool:
    """True for "fast", False for "faithful"; ValueError for anything else."""
    try:
        return PRECISIONS[precision]
    except (KeyError, TypeError):
        raise ValueError(
            f"{fn}: precision must be 'faithful' or 'fast', not {precision!r}"
        ) from None


def temperature_value(fn: str, t: Any, dtype: Optional[np.dtype] = None) -> float:
    """The temperature as a float: a real number (int, float, a numpy integer
    or floating scalar or 0-d array; not a bool, a string or a tensor),
    finite and > 0, and, given x's dtype, with a finite non-zero reciprocal
    in that dtype (the library multiplies by 1 / T rounded to it)."""
    if isinstance(t, np.ndarray) and t.ndim == 0 and t.dtype.kind in "iuf":
        t = t[()]
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Real):
        raise TypeError(f"{fn}: temperature must be a real number, not {t!r}")
    v = float(t)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{fn}: temperature must be finite and > 0, got {v!r}")
    if dtype is not None:
        with np.errstate(over="ignore", under="ignore"):
            s = dtype.type(1.0 / v)
        if not (np.isfinite(s) and s > 0):
            raise ValueError(
                f"{fn}: temperature {v!r} has no finite, non-zero reciprocal in {dtype.name}"
            )
    return v


def where_of(fn: str, where: Any, shape: tuple, kind: str) -> np.ndarray:
    """`where` as booleans broadcast to x's shape; a torch mask with a numpy x,
    or a numpy mask with a torch x, is a TypeError (one library per call)."""
    if kind == "torch":
        if isinstance(where, (np.ndarray, np.generic)):
            raise TypeError(f"{fn}: where is a numpy array but x is a torch.Tensor")
    elif A.is_torch(where):
        raise TypeError(f"{fn}: where is a torch.Tensor but x is a numpy array")
    return A.where_array(fn, where, shape)


def needs_grad(x: Any) -> bool:
    """True for a torch tensor that requires grad, with grad mode on."""
    t = _sys_modules.get("torch")
    return t is not None and isinstance(x, t.Tensor) and x.requires_grad and t.is_grad_enabled()


def row_op(
    fn: str, x: Any, axis: Any, where: Any, temperature: Any, out: Any, log: bool, fast: bool
) -> Any:
    """softmax (log False) or log_softmax of x along `axis`, no autograd."""
    kind = A.kind_of(x)
    if kind == "torch" and needs_grad(x):
        raise NotImplementedError(
            f"{fn}: x requires grad, and softdot's autograd form (softdot.torch.{fn}) takes "
            f"neither where= nor out=; call it under torch.no_grad() or on a detached tensor"
        )
    xa = A.float_input(fn, "x", x, kind, sixteen=True)
    nd = xa.ndim
    ax = A.softmax_axis(fn, "x", xa.shape, axis, "a softmax")
    t = temperature_value(fn, temperature, xa.dtype)
    w = None if where is None else where_of(fn, where, xa.shape, kind)
    user, o = A.output(fn, out, xa.shape, xa.dtype, kind)
    if out is not None:
        A.check_overlap(fn, o, "x", xa, True)
        A.check_overlap(fn, o, "where", w, False)
    if xa.size == 0:  # no rows (the rows themselves are not empty)
        return user
    if ax != nd - 1:
        xm, om = np.moveaxis(xa, ax, -1), np.moveaxis(o, ax, -1)
        wm = None if w is None else np.moveaxis(w, ax, -1)
    else:
        xm, om, wm = xa, o, w
    if A.row_contiguous(xm) and A.row_contiguous(om) and (wm is None or A.row_contiguous(wm)):
        _core.softmax_rows(xm, om, wm, log, t, fast)
    else:
        # A strided axis (axis 0 of a row-major matrix): the core transposes
        # blocks of rows into a contiguous scratch and back, no full copy.
        _core.softmax_strided(xm, om, wm, log, t, fast)
    return user


def fast_call(
    x: Any, out: Any, where: Any, axis: Any, temperature: Any, log: bool, fast: bool
) -> Any:
    """The no-option call (no where, axis -1, temperature 1.0) on a
    row-major float32/float64 array, straight to the core's NumPy fast path;
    None where the general path must run. (type checks: a bool is == 1 but
    is refused, a float axis -1.0 too.)"""
    if (
        where is not None
        or type(axis) is not int
        or axis != -1
        or type(temperature) is not float
        or temperature != 1.0
    ):
        return None
    tx = type(x)
    if tx is _ndarray:
        if out is None or type(out) is _ndarray:
            return _softmax_fast(x, out, log, fast)
        return None
    t = _sys_modules.get("torch")
    if t is None or tx is not t.Tensor or not x.is_cpu or x.requires_grad:
        return None
    d = x.dtype
    if d != t.float32 and d != t.float64:
        return None
    try:
        xn = x.numpy()
        if out is None:  # a new numpy array, then a tensor on its memory
            r = _softmax_fast(xn, None, log, fast)
            return None if r is None else t.from_numpy(r)
        if type(out) is t.Tensor and out.is_cpu and not out.requires_grad:
            return None if _softmax_fast(xn, out.numpy(), log, fast) is None else out
    except (RuntimeError, TypeError):
        pass
    return None


def softmax_backward(y: Any, dy: Any, axis: int = -1, out: Any = None) -> Any:
    """softdot.softmax_backward on float32 and float64 (the public function,
    _softmax.py, sends 16-bit inputs to _softmax16 first)."""
    fn = "softmax_backward"
    kind = A.kind_of(y)
    ya = A.float_input(fn, "y", y, kind, sixteen=True)
    da = A.float_input(fn, "dy", A.secondary(fn, "dy", dy, kind), kind, sixteen=True)
    if ya.dtype != da.dtype:
        raise TypeError(f"{fn}: y has dtype {ya.dtype.name} but dy has dtype {da.dtype.name}")
    if ya.shape != da.shape:
        raise ValueError(f"{fn}: y has shape {ya.shape} but dy has shape {da.shape}")
    nd = ya.ndim
    ax = A.softmax_axis(fn, "y", ya.shape, axis, "a softmax gradient")
    user, o = A.output(fn, out, ya.shape, ya.dtype, kind)
    if out is not None:
        A.check_overlap(fn, o, "y", ya, True)
        A.check_overlap(fn, o, "dy", da, True)
    if ya.size == 0:
        return user
    if ax != nd - 1:
        ym, dm, om = (np.moveaxis(a, ax, -1) for a in (ya, da, o))
    else:
        ym, dm, om = ya, da, o
    ym, dm = A.contiguous_rows(ym), A.contiguous_rows(dm)
    A.write_through(om, lambda target: _core.softmax_backward_rows(ym, dm, target))
    return user
