"""softmax and log_softmax as torch.autograd.Functions whose backward is
softdot's, for CPU tensors:

    >>> import torch, softdot
    >>> x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    >>> softdot.torch.softmax(x, dim=-1).sum().backward()

softmax's backward is softdot.softmax_backward (the inner product in twice
the working precision). log_softmax's is ``dy - p * sum(dy)`` with p the
faithful softmax of the saved input. Both backwards are differentiable
Functions too, with their derivatives written out below, so second (and
higher) derivatives are exact: ``torch.autograd.grad(..., create_graph=True)``
then ``backward()`` (a gradient penalty), ``torch.autograd.gradgradcheck`` and
``torch.func.grad`` (the Functions use ``setup_context``). Attention has no
backward yet: softdot's attention raises NotImplementedError on inputs that
require grad.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch

from . import _rowops as R

__all__ = ["softmax", "log_softmax", "Softmax", "LogSoftmax"]


def _check(fn: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softdot.torch.{fn}: x must be a torch.Tensor, not {type(x).__name__}")


def _scaled(t: torch.Tensor, temperature: float) -> torch.Tensor:
    return t if temperature == 1.0 else t / temperature


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
        _, dim, temperature, _ = inputs
        ctx.save_for_backward(output)
        ctx.dim = dim
        ctx.temperature = float(temperature)

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

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        y, dy, dim, temperature = inputs
        ctx.save_for_backward(y, dy)
        ctx.dim = dim
        ctx.temperature = float(temperature)

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
        x, dim, temperature = inputs
        ctx.save_for_backward(x)
        ctx.dim = dim
        ctx.temperature = float(temperature)

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
        return _scaled(dy - p * dy.sum(dim=dim, keepdim=True), temperature)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        x, dy, dim, temperature = inputs
        ctx.save_for_backward(x, dy)
        ctx.dim = dim
        ctx.temperature = float(temperature)

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
