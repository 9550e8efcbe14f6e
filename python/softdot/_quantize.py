"""quantize_kv: float32 rows to the int8 (values, scales) pairs of _int8.py.
See docs/python.md, "int8 keys and values"."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import _arrays as A
from . import _softdot as _core
from ._int8 import I8, is_dtype
from ._request import ready, target, to4


def _new(shape: Tuple[int, ...], dtype: np.dtype, kind: str) -> Tuple[Any, np.ndarray]:
    if kind == "torch":
        torch = A.torch_module()
        t = torch.empty(shape, dtype=torch.int8 if dtype == I8 else torch.float32)
        return t, t.numpy()
    a = np.empty(shape, dtype=dtype)
    return a, a


def _user_out(
    fn: str, name: str, o: Any, shape: Tuple[int, ...], dtype: np.dtype, kind: str
) -> Tuple[Any, np.ndarray]:
    want = "int8" if dtype == I8 else "float32"
    if kind == "torch":
        if not A.is_torch(o):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor when x is one")
        A.check_device(fn, name, o)
        if o.requires_grad:
            raise ValueError(f"{fn}: {name} requires grad; pass a tensor without autograd history")
        if not is_dtype(o, kind, dtype, want):
            raise TypeError(f"{fn}: {name} has dtype {A.dtype_str(o)}; expected {want}")
        if tuple(o.shape) != shape:
            raise ValueError(f"{fn}: {name} has shape {tuple(o.shape)}; expected {shape}")
        return o, o.numpy()
    if type(o) is not np.ndarray:
        raise TypeError(f"{fn}: {name} must be a numpy.ndarray when x is one")
    if o.dtype != dtype:
        raise TypeError(f"{fn}: {name} has dtype {o.dtype.name}; expected {want}")
    if o.shape != shape:
        raise ValueError(f"{fn}: {name} has shape {o.shape}; expected {shape}")
    if not o.flags.writeable:
        raise ValueError(f"{fn}: {name} is read-only")
    return o, o


def quantize_kv(x: Any, *, out: Any = None) -> Tuple[Any, Any]:
    """int8 values and one float32 scale per row, for int8 keys and values.

    For each row r = x[..., j, :] (the last axis):
    ``scale = max|r| / 127`` (rounded to float32),
    ``values = round(r / scale)`` (r / scale rounded to float32, then to
    the nearest integer, ties away from zero), so ``|values| <= 127`` and
    ``|scale * values - r| <= (0.5 + 2^-15) scale`` while the scale is a
    normal float (max|r| >= 127 * 2^-126: the bound takes the scale's
    rounding as relative); a row of zeros gets scale 0 and values 0. The
    arithmetic is the C++ library's
    (``softdot::quantize_kv``).

    Parameters
    ----------
    x : float32 array [..., S, E] (2 axes or more), numpy or CPU torch
    out : (values, scales), optional
        int8 [..., S, E] and float32 [..., S, 1] of x's library, written in
        place; neither may overlap x or the other.

    Returns
    -------
    (values, scales): the pair that :func:`scaled_dot_product_attention`
    and :func:`attention_weights` take as an int8 key or value.

    Raises
    ------
    ValueError naming the first element (C order) that is inf or NaN:
    only finite values can be quantised, and nothing is written then.
    """
    fn = "quantize_kv"
    kind = A.kind_of(x)
    if kind == "torch":
        A.check_device(fn, "x", x)
        if x.dtype != A.torch_module().float32:
            raise A.accepted(fn, "x", x, "float32")
        xa = A.tensor_view(fn, "x", x)
    else:
        xa = x if type(x) is np.ndarray else np.asarray(x)
        if xa.dtype == A.F32.newbyteorder(">"):
            xa = xa.astype(A.F32)  # big-endian float32 (a .npy from elsewhere)
        if xa.dtype != A.F32:
            raise A.accepted(fn, "x", xa, "float32")
    if xa.ndim < 2:
        raise ValueError(f"{fn}: x has shape {xa.shape}; expected [..., S, E] (2 axes or more)")
    shape = xa.shape
    sshape = shape[:-1] + (1,)
    if out is None:
        values, vo = _new(shape, I8, kind)
        scales, so = _new(sshape, A.F32, kind)
    else:
        if type(out) is not tuple or len(out) != 2:
            raise TypeError(f"{fn}: out must be a tuple (values, scales), got {type(out).__name__}")
        values, vo = _user_out(fn, "out values", out[0], shape, I8, kind)
        scales, so = _user_out(fn, "out scales", out[1], sshape, A.F32, kind)
        A.check_overlap(fn, vo, "x", xa, False)
        A.check_overlap(fn, so, "x", xa, False)
        A.check_overlap(fn, so, "out values", vo, False)
    if xa.size == 0:
        so[...] = 0  # a row of no elements holds no magnitude: scale 0
        return values, scales
    vt, vdirect = target(vo)
    st, sdirect = target(so)
    try:
        _core.quantize_kv(ready(to4(xa)), vt, st)
    except ValueError:
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(xa)
        if not bad.any():
            raise
        i = tuple(int(c) for c in np.argwhere(bad)[0])
        raise ValueError(
            f"{fn}: x {shape} holds {float(xa[i])!r} at {list(i)}: only finite values can be "
            f"quantised (nothing was written)"
        ) from None
    if not vdirect:
        np.copyto(vo, vt.reshape(shape))
    if not sdirect:
        np.copyto(so, st.reshape(sshape))
    return values, scales
