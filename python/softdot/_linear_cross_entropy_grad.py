"""softdot.linear_cross_entropy on torch tensors that require grad: a
torch.autograd.Function whose forward is the fused C++ call with both
gradients (three matrix products, no N x V logits kept) and whose backward
scales them by the incoming gradient. Imported on the first such call, so
numpy users never import torch."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from . import _linear_cross_entropy as LCE
from ._autograd import first_order


class LinearCrossEntropy(torch.autograd.Function):
    """(hidden, weight, targets, ignore_index, label_smoothing, reduction)
    -> (loss, grad_hidden, grad_weight); the gradients are the loss's (for
    "none": of the sum of the row losses), returned detached and saved for
    the backward, which multiplies them by the incoming gradient (for
    "none" that gradient must be the same for every row: a per-row one
    would need the logits again). Differentiating the gradients again
    (create_graph=True) raises (_autograd.first_order)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: Any,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, gh, gw = LCE.compute(
            hidden.detach(),
            weight.detach(),
            targets,
            ignore_index,
            label_smoothing,
            reduction,
            True,
        )
        # hidden and weight are saved for first_order, which attaches the
        # gradients to them when create_graph=True.
        ctx.save_for_backward(gh, gw, hidden, weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.reduction = reduction
        ctx.mark_non_differentiable(gh, gw)
        return loss, gh, gw

    @staticmethod
    @first_order("linear_cross_entropy")
    def backward(
        ctx: Any, dloss: torch.Tensor, _dgh: Any, _dgw: Any
    ) -> Tuple[Optional[torch.Tensor], ...]:
        gh, gw, _, _ = ctx.saved_tensors
        if ctx.reduction == "none":
            if dloss.numel() and not bool((dloss == dloss.reshape(-1)[0]).all()):
                raise NotImplementedError(
                    "linear_cross_entropy: the backward of reduction='none' takes the same "
                    "incoming gradient for every row (e.g. loss.sum()); reduce with 'sum' "
                    "or 'mean' for per-row weights"
                )
            scale = dloss.reshape(-1)[0] if dloss.numel() else dloss.new_zeros(())
        else:
            scale = dloss.reshape(())
        dh = dw = None
        if ctx.needs_input_grad[0]:
            dh = (gh * scale.to(torch.float32)).to(ctx.dtypes[0])
        if ctx.needs_input_grad[1]:
            dw = (gw * scale.to(torch.float32)).to(ctx.dtypes[1])
        return dh, dw, None, None, None, None
