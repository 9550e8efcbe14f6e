"""The losses users call: cross_entropy and linear_cross_entropy, for numpy
arrays and CPU torch tensors. Each runs its computation (_cross_entropy.py,
_linear_cross_entropy.py) or, on torch tensors that require grad, its
autograd Function (softdot.torch.CrossEntropy, _linear_cross_entropy_grad),
imported only then. The Functions import the computations, never this
module: no import circle. See docs/python.md."""

from __future__ import annotations

import importlib
from typing import Any

from . import _arrays as A
from . import _cross_entropy as CE
from . import _linear_cross_entropy as LCE
from . import _rowops as R


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
    return CE.compute(logits, targets, ignore_index, label_smoothing, reduction, grad)


def linear_cross_entropy(
    hidden: Any,
    weight: Any,
    targets: Any,
    /,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    grad: bool = False,
) -> Any:
    """``cross_entropy(hidden @ weight.T, targets)`` (the meaning of
    ``F.cross_entropy(F.linear(hidden, weight), targets, ...)``) without the
    N x V logits in memory: rows go in blocks whose logits are formed once,
    then their loss and gradient terms.

    Parameters
    ----------
    hidden : array or torch.Tensor, (N, D), float32 or bfloat16
        (torch.bfloat16 or ml_dtypes.bfloat16; both operands the same dtype).
        Products are accumulated in float32 chains of 64 added in double;
        the logits are float32.
    weight : array or torch.Tensor, (V, D), the same dtype and library
    targets : integer array or tensor, (N,)
        class indices in [0, V) or ``ignore_index``, else ValueError naming
        the row and the value.
    ignore_index, label_smoothing, reduction
        As ``softdot.cross_entropy``.
    grad : bool
        Also return ``(grad_hidden, grad_weight)``, float32, the gradients of
        the returned loss (for "none": of the sum of the row losses).

    With torch tensors that require grad (grad mode on), the loss comes from
    the autograd Function ``softdot.torch.LinearCrossEntropy``: its forward
    computes the loss and both gradients at once (three matrix products) and
    its backward scales them by the incoming gradient (for "none", which
    must then be the same for every row); gradients come back in the inputs'
    dtype. Double backward raises.

    Returns
    -------
    loss (float32 scalar, or (N,) for "none"), or
    (loss, grad_hidden, grad_weight) when ``grad=True``.
    """
    if A.is_torch(hidden) and (A.is_torch(weight)) and _needs_grad(hidden, weight):
        st = importlib.import_module("._linear_cross_entropy_grad", __package__)
        loss, gh, gw = st.LinearCrossEntropy.apply(
            hidden, weight, targets, ignore_index, label_smoothing, reduction
        )
        return (loss, gh, gw) if grad else loss
    return LCE.compute(hidden, weight, targets, ignore_index, label_smoothing, reduction, grad)


def _needs_grad(hidden: Any, weight: Any) -> bool:
    torch = A.torch_module()
    return torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
