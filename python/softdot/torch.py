"""softmax and log_softmax as torch.autograd.Functions whose backward is
softdot's, for CPU tensors:

    >>> import torch, softdot.torch as st
    >>> x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    >>> st.softmax(x, dim=-1).sum().backward()

softmax's backward is softdot.softmax_backward (the inner product in twice
the working precision). log_softmax's is ``dy - p * sum(dy)`` with p the
faithful softmax of the saved input. Neither supports a second derivative
(double backward raises). Attention has no backward yet: softdot's attention
raises NotImplementedError on inputs that require grad.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _softmax

__all__ = ["softmax", "log_softmax", "Softmax", "LogSoftmax"]


def _check(fn: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softdot.torch.{fn}: x must be a torch.Tensor, not {type(x).__name__}")


class Softmax(torch.autograd.Function):
    """y = softdot.softmax(x, axis=dim); dx = softdot.softmax_backward(y, dy) / T."""

    @staticmethod
    def forward(ctx, x, dim, temperature, precision):  # type: ignore[override]
        y = _softmax.softmax(x.detach(), axis=dim, temperature=temperature, precision=precision)
        ctx.save_for_backward(y)
        ctx.dim = dim
        ctx.temperature = float(temperature)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        dx = _softmax.softmax_backward(y, dy.to(y.dtype), axis=ctx.dim)
        if ctx.temperature != 1.0:
            dx = dx / ctx.temperature
        return dx, None, None, None


class LogSoftmax(torch.autograd.Function):
    """y = softdot.log_softmax(x, axis=dim); dx = (dy - p sum(dy)) / T with
    p = softdot.softmax(x, axis=dim)."""

    @staticmethod
    def forward(ctx, x, dim, temperature):  # type: ignore[override]
        xd = x.detach()
        y = _softmax.log_softmax(xd, axis=dim, temperature=temperature)
        ctx.save_for_backward(xd)
        ctx.dim = dim
        ctx.temperature = float(temperature)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        p = _softmax.softmax(x, axis=ctx.dim, temperature=ctx.temperature)
        dy = dy.to(p.dtype)
        dx = dy - p * dy.sum(dim=ctx.dim, keepdim=True)
        if ctx.temperature != 1.0:
            dx = dx / ctx.temperature
        return dx, None, None


def softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0,
            precision: str = "faithful") -> torch.Tensor:
    """softdot.softmax with autograd (same special values and bounds)."""
    _check("softmax", x)
    return Softmax.apply(x, dim, temperature, precision)


def log_softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0) -> torch.Tensor:
    """softdot.log_softmax with autograd."""
    _check("log_softmax", x)
    return LogSoftmax.apply(x, dim, temperature)
