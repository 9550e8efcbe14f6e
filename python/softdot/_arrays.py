"""Array plumbing shared by the public functions. No numerics here: every
value is computed by the C++ core.

Inside the package every array is a numpy array. A CPU torch tensor enters as
``tensor.numpy()``, a view of the same memory (no copy; about 0.5 us, where
passing the tensor through DLPack cost 6 us per array: timeit loops at the
Python prompt, not a command of the project), and results for
torch callers are allocated with torch and written through their numpy view,
so torch in gives torch out, sharing memory.

The zero-copy rule: the core reads any layout whose last axis (the row) is
contiguous, with any strides on the other axes (negative ones included for
the softmax family, where the attention core copies them). Only an input
whose row axis is not contiguous is copied, and only an output whose row axis
is not contiguous is written through a temporary.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
U16 = np.dtype(np.uint16)
U8 = np.dtype(np.uint8)
BOOL = np.dtype(np.bool_)
ndarray = np.ndarray


def torch_module():
    import torch

    return torch


def is_torch(x: Any) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def kind_of(x: Any) -> str:
    """'torch' for a torch.Tensor, else 'numpy' (array-likes become numpy)."""
    if type(x) is ndarray:
        return "numpy"
    return "torch" if is_torch(x) else "numpy"


def dtype_str(a: Any) -> str:
    d = a.dtype
    return str(d).replace("torch.", "")


def check_device(fn: str, name: str, t: Any) -> None:
    if not t.is_cpu:
        raise ValueError(
            f"{fn}: {name} is on device {t.device}; softdot runs on the CPU only "
            f"(move it with .cpu())"
        )


def tensor_view(fn: str, name: str, t: Any) -> np.ndarray:
    """The numpy view of a CPU tensor's memory (bfloat16 as its uint16 bits,
    fp8 as its bytes)."""
    check_device(fn, name, t)
    torch = torch_module()
    if t.requires_grad:
        if torch.is_grad_enabled():
            raise NotImplementedError(
                f"{fn}: {name} requires grad, and softdot.{fn} has no backward (softmax, "
                f"log_softmax and cross_entropy have one in softdot.torch); call it under "
                f"torch.no_grad() or on a detached tensor"
            )
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(U16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # fp8: the bytes
        return t.view(torch.uint8).numpy()
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # a lazy negation or conjugation bit
        return t.resolve_neg().resolve_conj().numpy()


def accepted(fn: str, name: str, a: Any, kinds: str) -> TypeError:
    return TypeError(f"{fn}: {name} has dtype {dtype_str(a)}; accepted: {kinds}")


_FLOAT_RULE = "float32, float64 (integers and booleans are converted to float64)"
# The functions that also take 16-bit inputs (the softmax family and
# cross_entropy: softdot._softmax16) name them in the same error.
_FLOAT_RULE_16 = (
    "float32, float64, float16, bfloat16 (torch.bfloat16 or ml_dtypes.bfloat16); "
    "integers and booleans are converted to float64"
)


def float_input(fn: str, name: str, x: Any, kind: str, sixteen: bool = False) -> np.ndarray:
    """x as a float32 or float64 numpy array (a view of a tensor's memory):
    integers and booleans become float64, as scipy does; any other dtype is a
    TypeError naming it and every accepted one (sixteen: the caller also
    takes float16 and bfloat16, handled before this call)."""
    rule = _FLOAT_RULE_16 if sixteen else _FLOAT_RULE
    if kind == "torch":
        torch = torch_module()
        d = x.dtype
        if d == torch.float32 or d == torch.float64:
            return tensor_view(fn, name, x)
        if d.is_floating_point or d.is_complex:
            raise accepted(fn, name, x, rule)
        check_device(fn, name, x)
        return tensor_view(fn, name, x.to(torch.float64))
    if type(x) is not ndarray:
        x = np.asarray(x)
    d = x.dtype
    if d is F32 or d is F64 or d == F32 or d == F64:
        return x
    if d.kind == "f" and d.itemsize in (4, 8):  # the other byte order
        return x.astype(d.newbyteorder("="))
    if d.kind in "iub":
        return x.astype(F64)
    raise accepted(fn, name, x, rule)


def secondary(fn: str, name: str, a: Any, kind: str) -> Any:
    """A second array (gradient, keys, ...) of the main input's library."""
    if kind == "torch":
        if not is_torch(a):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor when the main input is one")
        return a
    if is_torch(a):
        raise TypeError(f"{fn}: {name} is a torch.Tensor but the main input is a numpy array")
    return a if type(a) is ndarray else np.asarray(a)


def row_contiguous(a: np.ndarray) -> bool:
    return a.ndim == 0 or a.shape[-1] <= 1 or a.strides[-1] == a.itemsize


def contiguous_rows(a: np.ndarray) -> np.ndarray:
    """a itself when its last axis is contiguous, else a C-ordered copy."""
    return a if row_contiguous(a) else np.ascontiguousarray(a)


def write_through(o: np.ndarray, call) -> None:
    """call(target) writes a result of o's shape and dtype: into o itself when
    its rows (last axis) are contiguous, else into a temporary copied to o."""
    if row_contiguous(o):
        call(o)
    else:
        tmp = np.empty(o.shape, o.dtype)
        call(tmp)
        np.copyto(o, tmp)


def torch_dtype(d: np.dtype):
    torch = torch_module()
    return torch.float64 if d == F64 else torch.float32


def new_output(shape: Tuple[int, ...], dtype: np.dtype, kind: str) -> Tuple[Any, np.ndarray]:
    """(what the caller gets, its numpy view)."""
    if kind == "torch":
        t = torch_module().empty(shape, dtype=torch_dtype(dtype))
        return t, t.numpy()
    a = np.empty(shape, dtype=dtype)
    return a, a


def user_output(
    fn: str,
    out: Any,
    shape: Tuple[int, ...],
    dtype: np.dtype,
    kind: str,
    native: Any = None,
    expected: Optional[str] = None,
) -> Tuple[Any, np.ndarray]:
    """Checks a caller's `out` (same library, dtype and shape, writable) and
    returns (out, its numpy view; a torch bfloat16 tensor's as uint16 bits).
    native: the dtype out must have in its own library when it is not
    dtype's (a 16-bit one: torch.bfloat16, ml_dtypes.bfloat16, ...);
    expected: how the message names what is accepted."""
    expected = expected or dtype.name
    if kind == "torch":
        if not is_torch(out):
            raise TypeError(f"{fn}: out must be a torch.Tensor when the input is one")
        check_device(fn, "out", out)
        if out.requires_grad:
            raise ValueError(f"{fn}: out requires grad; pass a tensor without autograd history")
        want = native if native is not None else torch_dtype(dtype)
        if out.dtype != want or (native is None and dtype not in (F32, F64)):
            raise TypeError(f"{fn}: out has dtype {dtype_str(out)}; expected {expected}")
        if tuple(out.shape) != tuple(shape):
            raise ValueError(f"{fn}: out has shape {tuple(out.shape)}; expected {tuple(shape)}")
        return out, (out.numpy() if native is None else tensor_view(fn, "out", out))
    if type(out) is not ndarray:
        raise TypeError(f"{fn}: out must be a numpy.ndarray when the input is one")
    if out.dtype != (native if native is not None else dtype):
        raise TypeError(f"{fn}: out has dtype {out.dtype.name}; expected {expected}")
    if out.shape != tuple(shape):
        raise ValueError(f"{fn}: out has shape {out.shape}; expected {tuple(shape)}")
    if not out.flags.writeable:
        raise ValueError(f"{fn}: out is read-only")
    return out, out


def output(fn: str, out: Any, shape, dtype: np.dtype, kind: str) -> Tuple[Any, np.ndarray]:
    if out is None:
        return new_output(tuple(shape), dtype, kind)
    return user_output(fn, out, tuple(shape), dtype, kind)


def check_overlap(
    fn: str, out: np.ndarray, name: str, a: Optional[np.ndarray], in_place_ok: bool
) -> None:
    """out may be `a` itself (same memory and layout) when in_place_ok, and must
    not otherwise share memory with it. Checked on the caller's arrays, before
    any copy the package makes (which would hide the overlap from the core)."""
    if a is None or not np.may_share_memory(out, a):
        return
    if (
        in_place_ok
        and out.shape == a.shape
        and out.strides == a.strides
        and out.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    ):
        return
    try:
        # numpy documents max_work as any int; its stub only names -1 and 0.
        if not np.shares_memory(out, a, max_work=10000):  # type: ignore[arg-type]
            return  # interleaved, e.g. x[::2] and out[1::2] of one buffer
    except np.exceptions.TooHardError:
        pass  # undecided: refuse
    raise ValueError(
        f"{fn}: out overlaps {name}"
        + (
            f" without being the same array (in place needs out to be {name})"
            if in_place_ok
            else " (no overlap is allowed)"
        )
    )


def normalize_axis(fn: str, axis: Any, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{fn}: {name} must be an integer, not {axis!r}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(
            f"{fn}: {name} {a} is out of bounds for an array of {ndim} dimensions"
        )
    return a % ndim


def softmax_axis(fn: str, name: str, shape: Tuple[int, ...], axis: Any, what: str) -> int:
    """The axis of a softmax (``what``: "a softmax", "a softmax gradient")
    over `name` of `shape`, normalized; ValueError for a 0-d array or an
    empty axis."""
    if len(shape) == 0:
        raise ValueError(f"{fn}: {name} is 0-d; {what} needs at least one axis")
    ax = normalize_axis(fn, axis, len(shape))
    if shape[ax] == 0:
        raise ValueError(f"{fn}: {name} has shape {shape}: axis {ax} is empty")
    return ax


def reduced_axes(fn: str, axis: Any, ndim: int) -> Tuple[int, ...]:
    """The axes a reduction over `axis` (None: all of them; an int; a tuple
    or list) reduces, normalized. A 0-d array is reduced like a 1-d array of
    one: axis None, 0 or -1 (as scipy's logsumexp); any other axis is out
    of bounds."""
    if ndim == 0:
        if axis is not None:
            for a in axis if isinstance(axis, (tuple, list)) else (axis,):
                normalize_axis(fn, a, 1)
        return (0,)
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(normalize_axis(fn, a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{fn}: axis {tuple(axis)} repeats an axis")
        return axes
    return (normalize_axis(fn, axis, ndim),)


def where_array(fn: str, where: Any, shape: Tuple[int, ...]) -> np.ndarray:
    """`where` as booleans broadcast to `shape` (a stride-0 view, no copy)."""
    if is_torch(where):
        torch = torch_module()
        if where.dtype != torch.bool:
            raise TypeError(f"{fn}: where has dtype {dtype_str(where)}; it must be boolean")
        w = tensor_view(fn, "where", where)
    else:
        w = where if type(where) is ndarray else np.asarray(where)
        if w.dtype != BOOL:
            raise TypeError(f"{fn}: where has dtype {w.dtype.name}; it must be boolean")
    if w.shape == shape:
        return w
    try:
        return np.broadcast_to(w, shape)
    except ValueError:
        raise ValueError(
            f"{fn}: where has shape {tuple(w.shape)}, which does not broadcast to x's shape "
            f"{tuple(shape)}"
        ) from None


def wrap_scalar(value: float, dtype: np.dtype, kind: str) -> Any:
    if kind == "torch":
        return torch_module().tensor(value, dtype=torch_dtype(dtype))
    return dtype.type(value)


def result(user: Any, view: np.ndarray, kind: str, scalar_ok: bool = False) -> Any:
    """What to return: the caller's array; a numpy scalar for a 0-d numpy result
    when scalar_ok (as scipy's logsumexp)."""
    if kind == "numpy" and scalar_ok and view.ndim == 0:
        return view[()]
    return user
