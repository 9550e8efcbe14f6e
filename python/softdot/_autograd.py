"""The guard of the autograd Functions that have no second derivative
(attention and its rings, linear_cross_entropy): their backward is one C++
call, and its gradients are not differentiable again.

torch's ``once_differentiable`` is not enough for them: it marks the
gradients only when the incoming gradient itself requires grad, so a
gradient penalty (``torch.autograd.grad(loss, q, create_graph=True)``, then a
loss on that gradient) would silently treat the gradient as a constant and
drop the second-order terms. ``first_order`` marks the gradients whenever the
backward runs with grad mode on (``create_graph=True``) and an input or an
incoming gradient requires grad: differentiating them then raises a
RuntimeError naming the function, while using them as values works."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch


class _NoSecondDerivative(torch.autograd.Function):
    """Forward: the gradient, unchanged (a copy), attached to the tensors it
    depends on; backward: a RuntimeError naming the function."""

    @staticmethod
    def forward(ctx: Any, name: str, grad: torch.Tensor, *depends: torch.Tensor) -> torch.Tensor:
        ctx.name = name
        return grad.clone()

    @staticmethod
    def backward(ctx: Any, *_: Any) -> Any:
        raise RuntimeError(
            f"softdot.{ctx.name}: no second derivative: its gradients come from one C++ "
            f"call and are not differentiable again (a gradient penalty, or any other "
            f"use of create_graph=True through this step, needs torch's own implementation)"
        )


def first_order(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates an autograd Function's backward (a staticmethod's function):
    runs it with grad mode off and, when grad mode was on, passes each
    gradient tensor it returns through _NoSecondDerivative."""

    def decorate(backward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(backward)
        def wrapper(ctx: Any, *grads: Any) -> Any:
            recording = torch.is_grad_enabled()
            depends = []
            if recording:
                watched = list(ctx.saved_tensors) + list(grads)
                depends = [t for t in watched if isinstance(t, torch.Tensor) and t.requires_grad]
            with torch.no_grad():
                out = backward(ctx, *grads)
            if not depends:
                return out
            single = not isinstance(out, tuple)
            items = (out,) if single else out
            marked = tuple(
                _NoSecondDerivative.apply(name, g, *depends) if isinstance(g, torch.Tensor) else g
                for g in items
            )
            return marked[0] if single else marked

        return wrapper

    return decorate
