"""The fused cross-entropy of rows of logits against class indices, for
numpy arrays and CPU torch tensors (softdot::cross_entropy). See docs/python.md."""

from __future__ import annotations

import importlib
import math
from typing import Any, Optional

import numpy as np

from . import _arrays as A
from . import _rowops as R
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


def cross_entropy(
    logits: Any,
    targets: Any,
    /,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    grad: bool = False,
) -> Any:
    """Cross-entropy of rows of logits against class indices, with the meaning
    of ``torch.nn.functional.cross_entropy`` (class-index targets, no weights):

    ``loss_i = (1 - eps) (lse_i - x[i, t_i]) + eps (lse_i - mean_j x[i, j])``

    with ``lse_i`` softdot's logsumexp of row i; rows whose target is
    ``ignore_index`` get loss 0 and gradient 0 and are not counted by the mean.

    Parameters
    ----------
    logits : array_like or torch.Tensor
        float32 or float64, shape (N, C), or (C,) for one row; any row stride
        (the last axis contiguous, else copied). Never modified. A tensor
        that requires grad (with grad mode on) goes through the autograd
        Function ``softdot.torch.CrossEntropy``: the loss has a ``grad_fn``
        whose backward scales the gradient this call computes with the loss
        (first and higher derivatives; the targets get none).
    targets : integer array or torch.Tensor
        Shape (N,) (or 0-d for one row): class indices in [0, C) or
        ``ignore_index``; else ValueError naming the row and the value.
    ignore_index : int, default -100
    label_smoothing : float in [0, 1], default 0.0
        Over the whole vocabulary: the target distribution is
        ``(1 - eps) one_hot + eps / C``.
    reduction : {"mean", "sum", "none"}, default "mean"
        "mean" divides by the number of rows not ignored (NaN when there is
        none, as torch).
    grad : bool, default False
        Also return the gradient of the returned loss with respect to the
        logits: ``c (softmax - (1 - eps) one_hot - eps / C)``, c = 1 / count
        for "mean", else 1 (for "none": the gradient of the sum of the row
        losses, as torch's backward with a gradient of ones). With a tensor
        that requires grad the loss still carries its ``grad_fn`` and this
        gradient comes back detached.

    Returns
    -------
    loss, or (loss, grad) when ``grad=True``
        loss: a scalar of the logits' dtype (numpy scalar, or 0-d tensor) for
        "mean" and "sum"; an array of shape (N,) for "none". grad: the
        logits' shape, dtype and library.

    Accuracy: each row loss within 1 ulp (float32) of the exact value, plus a
    relative 2^-50 for float64 (the softmax sum's error); each gradient entry
    within ``c ulp(p) + 1 ulp``. Special values as softdot's softmax: a -inf
    logit has weight 0 (its loss is +inf if it is the target); a row of only
    -inf gives loss +inf (torch: NaN) and gradient ``-c ((1 - eps) one_hot +
    eps / V)``; k logits +inf share the weight (1/k each); a NaN makes the
    row's loss and gradient NaN, and only that row's. Through autograd, a zero
    gradient entry times an infinite incoming gradient is 0, never NaN.
    """
    if R.needs_grad(logits):
        st = importlib.import_module(".torch", __package__)
        loss, g = st.CrossEntropy.apply(logits, targets, ignore_index, label_smoothing, reduction)
        return (loss, g) if grad else loss
    fn = "cross_entropy"
    kind = A.kind_of(logits)
    if S16.info(logits) is not None:  # the shape checks below read x.ndim / shape
        x = S16.bits(fn, "logits", logits, kind)
    else:
        x = A.float_input(fn, "logits", logits, kind, sixteen=True)
    t = class_targets(fn, targets, kind)
    single = x.ndim == 1
    if single:
        if t.ndim != 0:
            raise ValueError(
                f"{fn}: logits have shape {x.shape} (one row) but targets {t.shape}; "
                f"expected a 0-d target"
            )
        x, t = x.reshape(1, -1), t.reshape(1)
    elif x.ndim != 2:
        raise ValueError(f"{fn}: logits have shape {x.shape}; expected (N, C) or (C,)")
    elif t.shape != (x.shape[0],):
        raise ValueError(
            f"{fn}: logits have shape {x.shape} but targets {t.shape}; expected ({x.shape[0]},)"
        )
    eps = check_options(fn, label_smoothing, reduction)
    if S16.info(logits) is not None:
        return S16.cross_entropy(fn, logits, t, ignore_index, eps, reduction, grad)
    x = A.contiguous_rows(x)
    n = x.shape[0]
    loss_user: Any = None
    loss_view: Optional[np.ndarray] = None
    if reduction == "none":
        loss_user, loss_view = A.new_output((n,), x.dtype, kind)
    grad_user: Any = None
    grad_view: Optional[np.ndarray] = None
    if grad:
        grad_user, grad_view = A.new_output(x.shape, x.dtype, kind)
    value = _core.cross_entropy_rows(
        x, t, loss_view, grad_view, int(ignore_index), eps, REDUCTIONS[reduction]
    )
    if reduction == "none":
        loss = loss_user.reshape(()) if single else loss_user
    else:
        loss = A.wrap_scalar(value, x.dtype, kind)
    if not grad:
        return loss
    return loss, (grad_user.reshape(-1) if single else grad_user)
