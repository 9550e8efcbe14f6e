"""int8 K/V caches: the ``(values, scales)`` pairs that the attention
functions take as int8 keys and values (quantize_kv, in _quantize.py, makes
them). See docs/python.md, "int8 keys and values".

An int8 K or V is a tuple of two arrays of the query's library: ``values``,
int8 [..., H, S, E], and ``scales``, float32 [..., H, S, 1], one per row.
Element (..., j, c) stands for ``scales[..., j, 0] * values[..., j, c]``
rounded once to float32 (the "dequantised" value), and attention on the pair
equals attention on float32 K and V holding the dequantised values, bit for
bit (include/softdot/attention.h, ``Int8KV``).

:func:`int8_kv` is the one place a pair is recognised and checked:
scaled_dot_product_attention and attention_weights call it, and so should
any other function taking int8 K/V (a paged cache's pages, say), with
:func:`ready_scales` for the core's view and :func:`check_scales_on_error`
around the core call.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Tuple

import numpy as np

from . import _arrays as A

I8 = np.dtype(np.int8)


def is_int8_kv(obj: Any) -> bool:
    """True for a (values, scales) pair: a tuple of exactly two arrays
    (numpy arrays or torch tensors). A nested tuple of numbers stays an
    array-like."""
    return (
        type(obj) is tuple
        and len(obj) == 2
        and all(isinstance(a, np.ndarray) or A.is_torch(a) for a in obj)
    )


def is_dtype(a: Any, kind: str, np_dtype: np.dtype, torch_name: str) -> bool:
    if kind == "torch":
        return a.dtype == getattr(A.torch_module(), torch_name)
    return a.dtype == np_dtype


def int8_kv(fn: str, name: str, obj: Any, kind: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """None when obj is not a (values, scales) pair (see is_int8_kv); else the
    numpy views (no copy; big-endian scales are converted) of its int8 values
    [..., S, E] and float32 scales
    [..., S, 1], of the query's library (`kind`) and on the CPU. TypeError
    for another library or dtype, ValueError for the shapes, each naming
    `fn` and "<name> values" or "<name> scales"."""
    if not is_int8_kv(obj):
        return None
    vname, sname = f"{name} values", f"{name} scales"
    values = A.secondary(fn, vname, obj[0], kind)
    scales = A.secondary(fn, sname, obj[1], kind)
    if kind == "torch":
        A.check_device(fn, vname, values)
        A.check_device(fn, sname, scales)
    if not is_dtype(values, kind, I8, "int8"):
        raise A.accepted(
            fn, vname, values, "int8 (an int8 key or value is a (values, scales) pair)"
        )
    if kind == "numpy" and scales.dtype == A.F32.newbyteorder(">"):
        scales = scales.astype(A.F32)  # big-endian float32 (a .npy from elsewhere)
    if not is_dtype(scales, kind, A.F32, "float32"):
        raise A.accepted(fn, sname, scales, "float32")
    if kind == "torch":
        values = A.tensor_view(fn, vname, values)
        scales = A.tensor_view(fn, sname, scales)
    if values.ndim < 2:
        raise ValueError(
            f"{fn}: {vname} has shape {values.shape}; expected [..., S, E] (2 axes or more)"
        )
    want = values.shape[:-1] + (1,)
    if scales.shape != want:
        raise ValueError(
            f"{fn}: {sname} has shape {scales.shape}; expected {want} for {vname} of shape "
            f"{values.shape} (one scale per row)"
        )
    return values, scales


def ready_scales(s4: np.ndarray) -> np.ndarray:
    """4-d scales as the core reads them: one scale per row, so a broadcast
    row axis (stride 0, e.g. one scale per head) becomes a copy (1/E of the
    values' size); any other layout is read in place."""
    if s4.shape[2] > 1 and s4.strides[2] == 0:
        return np.ascontiguousarray(s4)
    return s4


def first_bad_scale(scales: np.ndarray) -> Optional[Tuple[Tuple[int, ...], float]]:
    """(index, value) of the first scale (C order) that is not finite and
    >= 0, or None. For error messages only: it scans every scale."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(scales) & (scales >= 0))
    if not bad.any():
        return None
    i = tuple(int(c) for c in np.argwhere(bad)[0])
    return i, float(scales[i])


def check_scales_on_error(
    fn: str, pairs: Iterable[Tuple[str, np.ndarray]], call: Callable[[], Any]
) -> Any:
    """call(); when the core refuses the arguments (ValueError) because a
    scale is not finite and >= 0, the error names that scale by its index in
    the caller's array (the core names it in the 4-d view)."""
    try:
        return call()
    except ValueError:
        for name, s in pairs:
            found = first_bad_scale(s)
            if found is not None:
                i, val = found
                raise ValueError(
                    f"{fn}: {name} scales{list(i)} = {val!r}; scales must be finite and >= 0"
                ) from None
        raise
