"""The fused linear + cross-entropy of a language model's last layer,
``cross_entropy(hidden @ weight.T, targets)`` with its loss and the gradients
of hidden and weight, without the N x V logits in memory
(softdot::linear_cross_entropy). numpy arrays and CPU torch tensors, float32
or bfloat16. See docs/python.md."""

from __future__ import annotations

import importlib
from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _softdot as _core
from ._cross_entropy import REDUCTIONS, check_options, class_targets

FN = "linear_cross_entropy"


def _bf16_numpy() -> Any:
    try:
        return importlib.import_module("ml_dtypes").bfloat16
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        return None


def _operand(name: str, x: Any, kind: str) -> Tuple[np.ndarray, str]:
    """(a contiguous-rows numpy view: float32, or bfloat16 as uint16 bits;
    "f32" or "bf16")."""
    if kind == "torch":
        torch = A.torch_module()
        A.check_device(FN, name, x)
        if x.dtype == torch.float32:
            a, tag = x.detach().numpy(), "f32"
        elif x.dtype == torch.bfloat16:
            a, tag = x.detach().view(torch.int16).numpy().view(A.U16), "bf16"
        else:
            raise TypeError(f"{FN}: {name} has dtype {A.dtype_str(x)}; accepted: float32, bfloat16")
    else:
        a = x if type(x) is np.ndarray else np.asarray(x)
        bf = _bf16_numpy()
        if a.dtype == np.float32:
            tag = "f32"
        elif bf is not None and a.dtype == bf:
            a, tag = a.view(A.U16), "bf16"
        else:
            raise TypeError(
                f"{FN}: {name} has dtype {a.dtype.name}; accepted: float32, ml_dtypes.bfloat16"
            )
    if a.ndim != 2:
        raise ValueError(f"{FN}: {name} has shape {a.shape}; expected 2-d")
    return A.contiguous_rows(a), tag


def operands(
    hidden: Any, weight: Any, targets: Any, label_smoothing: Any, reduction: str
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, float, str]:
    """(hidden, weight, targets, label smoothing, "numpy" or "torch"), checked:
    the arrays as the C++ call takes them (float32, or bfloat16 as uint16
    bits; rows contiguous), targets int64."""
    kind = A.kind_of(hidden)
    if A.kind_of(weight) != kind:
        raise TypeError(f"{FN}: hidden and weight must both be numpy arrays or torch tensors")
    h, th = _operand("hidden", hidden, kind)
    w, tw = _operand("weight", weight, kind)
    if th != tw:
        raise TypeError(f"{FN}: hidden and weight have different dtypes ({th}, {tw})")
    if h.shape[1] != w.shape[1]:
        raise ValueError(
            f"{FN}: hidden has shape {h.shape} but weight {w.shape}; "
            f"expected weight (V, {h.shape[1]})"
        )
    t = class_targets(FN, targets, kind)
    if t.shape != (h.shape[0],):
        raise ValueError(
            f"{FN}: hidden has shape {h.shape} but targets {t.shape}; expected ({h.shape[0]},)"
        )
    eps = check_options(FN, label_smoothing, reduction)
    return h, w, t, eps, kind


def compute(
    hidden: Any,
    weight: Any,
    targets: Any,
    ignore_index: int,
    label_smoothing: Any,
    reduction: str,
    grad: bool,
) -> Any:
    """loss, or (loss, grad_hidden, grad_weight) (float32, the inputs'
    library). No autograd."""
    h, w, t, eps, kind = operands(hidden, weight, targets, label_smoothing, reduction)

    def rows(loss: Any, gh: Any, gw: Any) -> float:
        ii, red = int(ignore_index), REDUCTIONS[reduction]
        return _core.linear_cross_entropy_rows(h, w, t, loss, gh, gw, ii, eps, red)

    return with_outputs(rows, h, w, kind, reduction, grad)


def with_outputs(
    call: Any, h: np.ndarray, w: np.ndarray, kind: str, reduction: str, grad: bool
) -> Any:
    """Allocates the float32 outputs (the row losses for "none"; with grad,
    grad_hidden (n, d) and grad_weight (v, d), for hidden h (n, d) and
    weight w (v, d)) in the inputs' library, runs
    ``call(loss, grad_hidden, grad_weight)`` on their views (None where not
    asked for), which returns the reduced loss, and returns the loss, or
    (loss, grad_hidden, grad_weight)."""
    (n, d), v = h.shape, w.shape[0]
    f32 = np.dtype(np.float32)
    loss_user: Any = None
    loss_view: Optional[np.ndarray] = None
    if reduction == "none":
        loss_user, loss_view = A.new_output((n,), f32, kind)
    gh_user = gw_user = None
    gh_view: Optional[np.ndarray] = None
    gw_view: Optional[np.ndarray] = None
    if grad:
        gh_user, gh_view = A.new_output((n, d), f32, kind)
        gw_user, gw_view = A.new_output((v, d), f32, kind)
    value = call(loss_view, gh_view, gw_view)
    loss = loss_user if reduction == "none" else A.wrap_scalar(value, f32, kind)
    if not grad:
        return loss
    return loss, gh_user, gw_user
