"""softmax, log_softmax and cross_entropy as torch.autograd.Functions whose
backward is softdot's, for CPU tensors:

    >>> import torch, softdot
    >>> x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    >>> softdot.torch.softmax(x, dim=-1).sum().backward()

softmax's backward is softdot.softmax_backward (the inner product in twice
the working precision). log_softmax's is ``dy - p * sum(dy)`` with p the
faithful softmax of the saved input. cross_entropy's forward is the fused C++
cross_entropy, which returns the gradient with the loss; its backward scales
that saved gradient by the incoming one. The backwards are differentiable
Functions too, with their derivatives written out below, so second (and
higher) derivatives are exact: ``torch.autograd.grad(..., create_graph=True)``
then ``backward()`` (a gradient penalty), ``torch.autograd.gradgradcheck`` and
``torch.func.grad`` (the Functions use ``setup_context``). softdot.softmax,
softdot.log_softmax and softdot.cross_entropy call these for a tensor that
requires grad. Attention's autograd Function is in softdot._attention_grad
(softdot.scaled_dot_product_attention takes it for tensors that require grad;
its backward is the C++ attention_backward).

Special values: a weight of 0 (a -inf or fully masked logit) times an
infinite incoming gradient counts as 0 in the first derivatives, never NaN;
a NaN stays NaN in its row (docs/python.md, "Gradients at special values").
"""

from __future__ import annotations

from typing import Any, Tuple

import torch

from . import _cross_entropy as CE
from . import _rowops as R
from ._linear_cross_entropy_grad import LinearCrossEntropy

__all__ = [
    "softmax",
    "log_softmax",
    "cross_entropy",
    "Softmax",
    "LogSoftmax",
    "CrossEntropy",
    "LinearCrossEntropy",
]


def _check(fn: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softdot.torch.{fn}: x must be a torch.Tensor, not {type(x).__name__}")


def _scaled(t: torch.Tensor, temperature: float) -> torch.Tensor:
    return t if temperature == 1.0 else t / temperature


def _times(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a * b (broadcast), where a 0 in a times an infinite b counts as 0 (a
    weight 0 times an infinite gradient: never NaN); NaN stays NaN. The mask
    is formed only when b holds an infinity."""
    r = a * b
    if not bool(torch.isfinite(b).all()):
        r = torch.where((a == 0) & torch.isinf(b), torch.zeros((), dtype=r.dtype), r)
    return r


def _save(ctx: Any, tensors: Tuple[Any, ...], dim: int, temperature: float) -> None:
    """What every Function of the softmax family keeps: its tensors, the
    axis and the temperature."""
    ctx.save_for_backward(*tensors)
    ctx.dim = dim
    ctx.temperature = float(temperature)


def _save_with_dy(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
    """setup_context of SoftmaxGrad and LogSoftmaxGrad, whose inputs are
    (y or x, dy, dim, temperature): the two tensors saved."""
    _save(ctx, inputs[:2], inputs[2], inputs[3])


class Softmax(torch.autograd.Function):
    """y = softdot.softmax(x, axis=dim); dx = softdot.softmax_backward(y, dy) / T."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        dim: int,
        temperature: float,
        precision: str,
    ) -> torch.Tensor:
        fast = R.precision_flag("softmax", precision)
        return R.row_op("softmax", x.detach(), dim, None, temperature, None, False, fast)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        _save(ctx, (output,), inputs[1], inputs[2])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return SoftmaxGrad.apply(y, dy, ctx.dim, ctx.temperature), None, None, None


class SoftmaxGrad(torch.autograd.Function):
    """dx = y (dy - <dy, y>) / T (softdot.softmax_backward), differentiable in
    y and dy. With u the gradient of dx, s = <dy, y> and q = <u, y>:
    d/d(dy) = y (u - q) / T (this Function again), d/dy = (u (dy - s) - dy q) / T."""

    @staticmethod
    def forward(
        y: torch.Tensor,
        dy: torch.Tensor,
        dim: int,
        temperature: float,
    ) -> torch.Tensor:
        yd = y.detach()
        dx = R.softmax_backward(yd, dy.detach().to(yd.dtype), axis=dim)
        return _scaled(dx, temperature)

    setup_context = staticmethod(_save_with_dy)

    @staticmethod
    def backward(ctx: Any, u: torch.Tensor):
        y, dy = ctx.saved_tensors
        dim, t = ctx.dim, ctx.temperature
        dy = dy.to(y.dtype)
        g_y = g_dy = None
        if ctx.needs_input_grad[1]:
            g_dy = SoftmaxGrad.apply(y, u, dim, t)
        if ctx.needs_input_grad[0]:
            s = (dy * y).sum(dim=dim, keepdim=True)
            q = (u * y).sum(dim=dim, keepdim=True)
            g_y = _scaled(u * (dy - s) - dy * q, t)
        return g_y, g_dy, None, None


class LogSoftmax(torch.autograd.Function):
    """y = softdot.log_softmax(x, axis=dim); dx = (dy - p sum(dy)) / T with
    p = softdot.softmax(x, axis=dim)."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        dim: int,
        temperature: float,
    ) -> torch.Tensor:
        return R.row_op("log_softmax", x.detach(), dim, None, temperature, None, True, False)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        _save(ctx, inputs[:1], inputs[1], inputs[2])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        (x,) = ctx.saved_tensors
        return LogSoftmaxGrad.apply(x, dy, ctx.dim, ctx.temperature), None, None


class LogSoftmaxGrad(torch.autograd.Function):
    """dx = (dy - p sum(dy)) / T with p = softmax(x / T), differentiable in x
    and dy. With u the gradient of dx and S = sum(dy): d/d(dy) = (u - <u, p>) / T,
    d/dx = -S p (u - <u, p>) / T^2 = -S softmax_backward(p, u) / T^2."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        dy: torch.Tensor,
        dim: int,
        temperature: float,
    ) -> torch.Tensor:
        xd = x.detach()
        p = R.row_op("log_softmax", xd, dim, None, temperature, None, False, False)
        dy = dy.detach().to(p.dtype)
        # _times: an entry of weight 0 keeps dy_i when sum(dy) is infinite.
        return _scaled(dy - _times(p, dy.sum(dim=dim, keepdim=True)), temperature)

    setup_context = staticmethod(_save_with_dy)

    @staticmethod
    def backward(ctx: Any, u: torch.Tensor):
        x, dy = ctx.saved_tensors
        dim, t = ctx.dim, ctx.temperature
        # p as a differentiable function of x, for derivatives past the second.
        p = Softmax.apply(x, dim, t, "faithful")
        g_x = g_dy = None
        if ctx.needs_input_grad[1]:
            g_dy = _scaled(u - (u * p).sum(dim=dim, keepdim=True), t)
        if ctx.needs_input_grad[0]:
            total = dy.to(p.dtype).sum(dim=dim, keepdim=True)
            g_x = -_scaled(total * SoftmaxGrad.apply(p, u, dim, t), t)
        return g_x, g_dy, None, None


class CrossEntropy(torch.autograd.Function):
    """(loss, grad) = softdot.cross_entropy(logits, targets, ..., grad=True),
    the fused C++ call; grad is the gradient of the returned loss (for
    "none": of the sum of the row losses), saved and returned as a second,
    non-differentiable output. Backward: grad times the incoming gradient
    (CrossEntropyGrad, per row for "none")."""

    @staticmethod
    def forward(
        logits: torch.Tensor,
        targets: Any,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        return CE.compute(
            logits.detach(),
            targets,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
            grad=True,
        )

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        logits, targets, ignore_index, label_smoothing, reduction = inputs
        _, grad = output
        ctx.mark_non_differentiable(grad)
        # targets: a tensor here (forward checked them); kept as given, since
        # under torch.func it is a wrapper that has no numpy view.
        ctx.save_for_backward(logits, grad, targets)
        ctx.ignore_index = int(ignore_index)
        ctx.eps = float(label_smoothing)
        ctx.reduction = reduction

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor, _dgrad: Any):
        x, grad, t = ctx.saved_tensors
        dx = CrossEntropyGrad.apply(x, dloss, grad, t, ctx.ignore_index, ctx.eps, ctx.reduction)
        return dx, None, None, None, None


class CrossEntropyGrad(torch.autograd.Function):
    """dx = grad * dloss (per row for "none"; a 0 times an infinite dloss is
    0), with grad = c (p - q) on the rows not ignored: p = softmax(x), q =
    (1 - eps) one_hot(t) + eps / V, c = 1 / count for "mean", else 1.
    Differentiable in x and dloss. With u the gradient of dx and s = dloss
    (row i's for "none"): d/d(dloss) = sum of u * grad (per row for "none");
    d/dx = s c p (u - <u, p>) = s c softmax_backward(p, u) on those rows, 0
    on the ignored ones (their gradient is 0 whatever x is)."""

    @staticmethod
    def forward(
        x: torch.Tensor,
        dloss: torch.Tensor,
        grad: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        eps: float,
        reduction: str,
    ) -> torch.Tensor:
        s = dloss.detach().to(grad.dtype)
        if reduction == "none":
            s = s.unsqueeze(-1)
        return _times(grad, s)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        x, dloss, grad, targets, ignore_index, eps, reduction = inputs
        ctx.save_for_backward(x, dloss, grad, targets)
        ctx.ignore_index = ignore_index
        ctx.eps = eps
        ctx.reduction = reduction

    @staticmethod
    def backward(ctx: Any, u: torch.Tensor):
        x, dloss, grad, t = ctx.saved_tensors
        none = ctx.reduction == "none"
        x2, u2, t1 = x.reshape(-1, x.shape[-1]), u.reshape(-1, x.shape[-1]), t.reshape(-1).long()
        kept = (t1 != ctx.ignore_index).unsqueeze(-1)
        c = 1.0 / max(int(kept.sum()), 1) if ctx.reduction == "mean" else 1.0
        # p as a differentiable function of x, for derivatives past the second.
        p = Softmax.apply(x2, -1, 1.0, "faithful") if ctx.needs_input_grad[0] else None
        g_x = g_dloss = None
        if ctx.needs_input_grad[1]:
            if p is not None and torch.is_grad_enabled():
                # grad as a function of x (create_graph): c (p - q) on kept rows.
                v = x.shape[-1]
                q = torch.full_like(p, ctx.eps / v)
                safe = torch.where(kept.squeeze(-1), t1, torch.zeros_like(t1))
                q = q.scatter_add(-1, safe.unsqueeze(-1), torch.full_like(p[:, :1], 1.0 - ctx.eps))
                g2 = torch.where(kept, c * (p - q), torch.zeros((), dtype=p.dtype))
            else:
                g2 = grad.reshape(-1, x.shape[-1]).to(u.dtype)
            w = u2 * g2
            g_dloss = w.sum(-1).reshape(dloss.shape) if none else w.sum().reshape(dloss.shape)
        if ctx.needs_input_grad[0]:
            s = dloss.to(x.dtype).reshape(-1, 1) if none else dloss.to(x.dtype)
            sg = SoftmaxGrad.apply(p, u2.to(x.dtype), -1, 1.0)
            g_x = torch.where(kept, (s * c) * sg, torch.zeros((), dtype=x.dtype)).reshape(x.shape)
        return g_x, g_dloss, None, None, None, None, None


def softmax(
    x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0, precision: str = "faithful"
) -> torch.Tensor:
    """softdot.softmax with autograd (same special values and bounds), to any
    order of derivative."""
    _check("softmax", x)
    return Softmax.apply(x, dim, temperature, precision)


def log_softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0) -> torch.Tensor:
    """softdot.log_softmax with autograd, to any order of derivative."""
    _check("log_softmax", x)
    return LogSoftmax.apply(x, dim, temperature)


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    /,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """softdot.cross_entropy with autograd (the meaning of
    ``torch.nn.functional.cross_entropy`` with class-index targets), to any
    order of derivative in the logits; the targets get no gradient."""
    _check("cross_entropy", logits)
    loss, _ = CrossEntropy.apply(logits, targets, ignore_index, label_smoothing, reduction)
    return loss
