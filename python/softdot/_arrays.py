"""Array plumbing shared by the public functions: which library an array
belongs to (numpy or torch), dtype rules, output allocation, axis moves and
the rare copies. No numerics here: every value is computed by the C++ core.

The zero-copy rule: the core reads any layout whose last axis (the row) is
contiguous, with any strides on the other axes (negative ones included for
the softmax family). Only an input whose row axis is not contiguous is
copied, and only an output whose row axis is not contiguous is written
through a temporary.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
BOOL = np.dtype(np.bool_)


def _is_torch(x: Any) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def torch_module():
    import torch

    return torch


def kind_of(x: Any) -> str:
    """'numpy' or 'torch' for an array; other inputs become numpy arrays."""
    if type(x) is np.ndarray:
        return "numpy"
    if _is_torch(x):
        return "torch"
    return "numpy"


def check_device(fn: str, name: str, t: Any) -> None:
    if t.device.type != "cpu":
        raise ValueError(
            f"{fn}: {name} is on device {t.device}; softdot runs on the CPU only "
            f"(move it with .cpu())"
        )


def dtype_name(a: Any) -> str:
    d = a.dtype
    if isinstance(d, np.dtype):
        return d.name
    return str(d).replace("torch.", "")


def float_input(fn: str, name: str, x: Any, kind: str) -> Any:
    """x as a float32 or float64 array of its own library: integers and
    booleans become float64 (as scipy does); any other dtype is a TypeError."""
    if kind == "torch":
        check_device(fn, name, x)
        torch = torch_module()
        if x.dtype in (torch.float32, torch.float64):
            return x.detach() if x.requires_grad else x
        if not x.is_floating_point() and not x.is_complex():
            return x.detach().to(torch.float64)
        raise TypeError(
            f"{fn}: {name} has dtype {dtype_name(x)}; accepted: float32, float64 "
            f"(integers are converted to float64)"
        )
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    d = x.dtype
    if d is F32 or d is F64 or d == F32 or d == F64:
        return x
    if d.kind in "iub":
        return x.astype(np.float64)
    raise TypeError(
        f"{fn}: {name} has dtype {x.dtype.name}; accepted: float32, float64 "
        f"(integers are converted to float64)"
    )


def same_kind(fn: str, name: str, a: Any, kind: str) -> Any:
    """An array of `kind` for a secondary input (mask, gradient, out)."""
    if kind == "torch":
        if not _is_torch(a):
            if isinstance(a, np.ndarray):
                return torch_module().from_numpy(a)
            return torch_module().as_tensor(a)
        check_device(fn, name, a)
        return a
    if _is_torch(a):
        raise TypeError(f"{fn}: {name} is a torch.Tensor but the main input is a numpy array")
    return a if type(a) is np.ndarray else np.asarray(a)


def strides(a: Any, kind: str) -> tuple:
    """Strides in elements."""
    if kind == "torch":
        return a.stride()
    item = a.itemsize
    return tuple(s // item for s in a.strides)


def row_contiguous(a: Any, kind: str) -> bool:
    if a.ndim == 0 or a.shape[-1] <= 1:
        return True
    if kind == "torch":
        return a.stride(-1) == 1
    return a.strides[-1] == a.itemsize


def contiguous_rows(a: Any, kind: str) -> Any:
    """a itself when its last axis is contiguous, else a C-ordered copy."""
    if row_contiguous(a, kind):
        return a
    return a.contiguous() if kind == "torch" else np.ascontiguousarray(a)


def no_negative_strides(a: Any, kind: str) -> Any:
    """The attention core takes non-negative strides only: copy otherwise."""
    if kind == "numpy" and any(s < 0 for s in a.strides):
        return np.ascontiguousarray(a)
    return a


def moveaxis(a: Any, src, dst, kind: str) -> Any:
    if kind == "torch":
        return a.movedim(src, dst)
    return np.moveaxis(a, src, dst)


def empty(shape, like: Any, kind: str, dtype=None) -> Any:
    if kind == "torch":
        torch = torch_module()
        return torch.empty(shape, dtype=dtype or like.dtype)
    return np.empty(shape, dtype=dtype or like.dtype)


def empty_like(a: Any, kind: str) -> Any:
    if kind == "torch":
        return torch_module().empty_like(a)
    return np.empty_like(a)


def copy_into(dst: Any, src: Any, kind: str) -> None:
    if kind == "torch":
        dst.copy_(src)
    else:
        np.copyto(dst, src)


def normalize_axis(fn: str, axis: Any, ndim: int, name: str = "axis") -> int:
    try:
        a = int(axis)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: {name} must be an integer, not {axis!r}") from None
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(
            f"{fn}: {name} {a} is out of bounds for an array of {ndim} dimensions"
        )
    return a % ndim


def check_out(fn: str, out: Any, shape: tuple, dtype: Any, kind: str) -> Any:
    """Checks a caller's `out`: same library, dtype and shape, writable."""
    if kind == "torch":
        if not _is_torch(out):
            raise TypeError(f"{fn}: out must be a torch.Tensor when the input is one")
        check_device(fn, "out", out)
        if out.requires_grad:
            raise ValueError(f"{fn}: out requires grad; pass a tensor without autograd history")
    else:
        if type(out) is not np.ndarray:
            raise TypeError(f"{fn}: out must be a numpy.ndarray when the input is one")
        if not out.flags.writeable:
            raise ValueError(f"{fn}: out is read-only")
    if out.dtype != dtype:
        raise TypeError(f"{fn}: out has dtype {dtype_name(out)}; expected {dtype_name_of(dtype)}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{fn}: out has shape {tuple(out.shape)}; expected {tuple(shape)}")
    return out


def dtype_name_of(d: Any) -> str:
    return d.name if isinstance(d, np.dtype) else str(d).replace("torch.", "")


def where_array(fn: str, where: Any, shape: tuple, kind: str) -> Any:
    """`where` broadcast to `shape` (a stride-0 view, no copy), as booleans."""
    if _is_torch(where):
        check_device(fn, "where", where)
        torch = torch_module()
        if where.dtype != torch.bool:
            raise TypeError(f"{fn}: where has dtype {dtype_name(where)}; it must be boolean")
        try:
            w = where.broadcast_to(shape)
        except RuntimeError:
            raise ValueError(
                f"{fn}: where has shape {tuple(where.shape)}, which does not broadcast "
                f"to x's shape {tuple(shape)}"
            ) from None
        return w if kind == "torch" else w.numpy()
    w = np.asarray(where)
    if w.dtype != BOOL:
        raise TypeError(f"{fn}: where has dtype {w.dtype.name}; it must be boolean")
    try:
        return np.broadcast_to(w, shape)
    except ValueError:
        raise ValueError(
            f"{fn}: where has shape {w.shape}, which does not broadcast to x's shape "
            f"{tuple(shape)}"
        ) from None


def wrap_scalar(value: float, dtype: Any, kind: str) -> Any:
    if kind == "torch":
        return torch_module().tensor(value, dtype=dtype)
    return dtype.type(value)
