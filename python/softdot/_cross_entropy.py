"""The fused cross-entropy of rows of logits against class indices, for
numpy arrays and CPU torch tensors (softdot::cross_entropy). See docs/python.md."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from . import _arrays as A
from . import _softdot as _core
from . import _softmax16 as S16

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


def check_options(fn: str, label_smoothing: Any, reduction: Any) -> float:
    """The label smoothing eps as a float in [0, 1], after checking it and the
    reduction (cross_entropy and linear_cross_entropy)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    try:
        eps = float(label_smoothing)
    except (TypeError, ValueError):
        raise TypeError(
            f"{fn}: label_smoothing must be a real number, not {label_smoothing!r}"
        ) from None
    if not (math.isfinite(eps) and 0.0 <= eps <= 1.0):
        raise ValueError(f"{fn}: label_smoothing must be in [0, 1], got {eps!r}")
    return eps


def class_targets(fn: str, targets: Any, kind: str) -> np.ndarray:
    """targets as a contiguous int64 numpy array (class indices); TypeError
    for a non-integer dtype. Shared with softdot.distributed.cross_entropy."""
    t = A.secondary(fn, "targets", targets, kind)
    if kind == "torch":
        A.check_device(fn, "targets", t)
        t = t.detach().numpy()
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: targets have dtype {t.dtype.name}; expected integer class indices")
    t = np.asarray(t, dtype=np.int64)
    return np.ascontiguousarray(t) if t.ndim else t


def compute(
    logits: Any,
    targets: Any,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
    grad: bool,
) -> Any:
    """softdot.cross_entropy without autograd (the public function,
    _losses.py, and the autograd Function, softdot.torch.CrossEntropy, call
    this with every argument; the defaults are the public function's)."""
    fn = "cross_entropy"
    kind = A.kind_of(logits)
    if S16.info(logits) is not None:  # the shape checks below read x.ndim / shape
        x = S16.bits(fn, "logits", logits, kind)
    else:
        x = A.float_input(fn, "logits", logits, kind, sixteen=True)
    t = class_targets(fn, targets, kind)
    single = x.ndim == 1
    if x.ndim not in (1, 2):
        raise ValueError(f"{fn}: logits have shape {x.shape}; expected (N, C) or (C,)")
    if single:
        x = x.reshape(1, -1)
    t = row_targets(fn, x, single, t)
    eps = check_options(fn, label_smoothing, reduction)
    if S16.info(logits) is not None:
        return S16.cross_entropy(fn, logits, t, ignore_index, eps, reduction, grad)
    x = A.contiguous_rows(x)

    def rows(loss: Any, g: Any) -> float:
        return _core.cross_entropy_rows(
            x, t, loss, g, int(ignore_index), eps, REDUCTIONS[reduction]
        )

    return rows_result(rows, x, kind, single, reduction, grad)


def row_targets(fn: str, x: np.ndarray, single: bool, t: np.ndarray) -> np.ndarray:
    """t checked against the rows of logits x (2-d; single: the caller's one
    row, whose target is 0-d), as (rows,). Shared with
    softdot.distributed.cross_entropy."""
    if single:
        if t.ndim != 0:
            raise ValueError(
                f"{fn}: logits have shape {x.shape[1:]} (one row) but targets {t.shape}; "
                f"expected a 0-d target"
            )
        return t.reshape(1)
    if t.shape != (x.shape[0],):
        raise ValueError(
            f"{fn}: logits have shape {x.shape} but targets {t.shape}; expected ({x.shape[0]},)"
        )
    return t


def rows_result(
    call: Callable[[Optional[np.ndarray], Optional[np.ndarray]], float],
    x: np.ndarray,
    kind: str,
    single: bool,
    reduction: str,
    grad: bool,
) -> Any:
    """Allocates the outputs for the rows x (the row losses for "none"; with
    grad, the gradient, x's shape), x's dtype in the caller's library, runs
    ``call(loss, grad)`` on their views (None where not asked for), which
    returns the reduced loss, and returns the loss, or (loss, grad), in the
    caller's shapes (single: one row). Shared with
    softdot.distributed.cross_entropy."""
    loss_user: Any = None
    loss_view: Optional[np.ndarray] = None
    if reduction == "none":
        loss_user, loss_view = A.new_output((x.shape[0],), x.dtype, kind)
    grad_user: Any = None
    grad_view: Optional[np.ndarray] = None
    if grad:
        grad_user, grad_view = A.new_output(x.shape, x.dtype, kind)
    value = call(loss_view, grad_view)
    if reduction == "none":
        loss = loss_user.reshape(()) if single else loss_user
    else:
        loss = A.wrap_scalar(value, x.dtype, kind)
    if not grad:
        return loss
    return loss, (grad_user.reshape(-1) if single else grad_user)
