"""Every torch.autograd.Function of the package, audited for second
derivatives: where a double backward exists, gradgradcheck in float64; where
it does not, a gradient penalty (create_graph=True, then a loss on the
gradient plus another term) must raise, never run with the second-order
terms silently dropped. A Function missing from the table fails the audit."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import softdot

torch = pytest.importorskip("torch")

# Function (module, qualified name) -> how its second derivative is checked.
TABLE = {
    ("softdot.torch", "Softmax"): "gradgradcheck",
    ("softdot.torch", "SoftmaxGrad"): "gradgradcheck",  # Softmax's third derivative
    ("softdot.torch", "LogSoftmax"): "gradgradcheck",
    ("softdot.torch", "LogSoftmaxGrad"): "gradgradcheck",
    ("softdot.torch", "CrossEntropy"): "gradgradcheck",
    ("softdot.torch", "CrossEntropyGrad"): "gradgradcheck",
    ("softdot._attention_grad", "_Attention"): "raises",
    ("softdot._linear_cross_entropy_grad", "LinearCrossEntropy"): "raises",
    ("softdot._gloo_ring", "RingFunction"): "raises",
    # Built by softdot.distributed._ring_function(); checked under mpirun by
    # mpi_ring_worker.py ("no second derivative"), for every P.
    ("softdot.distributed", "_ring_function.<locals>.RingAttention"): "raises",
    ("softdot._autograd", "_NoSecondDerivative"): "the guard itself",
}


def _functions():
    for m in (
        "softdot.torch",
        "softdot._attention_grad",
        "softdot._linear_cross_entropy_grad",
        "softdot._gloo_ring",
        "softdot.distributed",
        "softdot._autograd",
    ):
        importlib.import_module(m)
    import softdot.distributed as sd

    sd._ring_function()
    seen, todo = set(), list(torch.autograd.Function.__subclasses__())
    while todo:
        c = todo.pop()
        todo += c.__subclasses__()
        if c.__module__.startswith("softdot"):
            seen.add((c.__module__, c.__qualname__))
    return seen


def test_every_function_is_in_the_table():
    assert _functions() == set(TABLE)


def _penalty_raises(f, *inputs):
    """f(*inputs) -> a tensor; the gradient penalty through it must raise
    naming softdot, while the first gradient itself is right to use."""
    out = f(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs, create_graph=True)
    loss = sum((g * g).sum() for g in grads) + sum(t.sum() for t in inputs)
    with pytest.raises(RuntimeError, match="no second derivative"):
        loss.backward()
    # Without create_graph the same gradients, as values.
    plain = torch.autograd.grad(f(*inputs).sum(), inputs)
    for a, b in zip(grads, plain):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_attention_second_derivative_raises(dtype):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g).to(dtype).requires_grad_() for _ in range(3))
    _penalty_raises(
        lambda a, b, c: softdot.scaled_dot_product_attention(a, b, c, causal=True), q, k, v
    )
    # Through the lse alone too, and through the bias and the sinks.
    bias = torch.randn(5, 5, generator=g, dtype=torch.float32).requires_grad_()
    sinks = torch.randn(2, generator=g).requires_grad_()
    _penalty_raises(
        lambda a, b: softdot.scaled_dot_product_attention(
            q.detach(), k.detach(), v.detach(), bias=a, sinks=b, return_lse=True
        )[1],
        bias,
        sinks,
    )


def test_linear_cross_entropy_second_derivative_raises():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(8, 16, generator=g).requires_grad_()
    w = torch.randn(32, 16, generator=g).requires_grad_()
    t = torch.randint(0, 32, (8,), generator=g)
    _penalty_raises(lambda a, b: softdot.linear_cross_entropy(a, b, t), h, w)


def test_gloo_ring_second_derivative_raises(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    import softdot.distributed as sd

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 2, 6, 4, generator=g).requires_grad_() for _ in range(3))
        _penalty_raises(
            lambda a, b, c: sd.ring_attention(
                None, a, b, c, seq_len=6, causal=True, group=dist.group.WORLD
            ),
            q,
            k,
            v,
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "name",
    ["softmax", "log_softmax", "cross_entropy"],
)
def test_double_backward_exists_and_is_right(name):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1, 6, 0])
    f = {
        "softmax": lambda a: softdot.torch.softmax(a, -1),
        "log_softmax": lambda a: softdot.torch.log_softmax(a, -1),
        "cross_entropy": lambda a: softdot.torch.cross_entropy(a, t, label_smoothing=0.1),
    }[name]
    assert torch.autograd.gradgradcheck(f, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)
    # The third derivative (the Grad Functions' own backward) against torch's.
    ref = {
        "softmax": lambda a: torch.softmax(a, -1),
        "log_softmax": lambda a: torch.log_softmax(a, -1),
        "cross_entropy": lambda a: torch.nn.functional.cross_entropy(a, t, label_smoothing=0.1),
    }[name]
    w = torch.randn(3, 7, generator=g, dtype=torch.float64)

    def third(fun):
        (g1,) = torch.autograd.grad(
            (fun(x) * (w if fun(x).ndim else 1)).sum(), x, create_graph=True
        )
        (g2,) = torch.autograd.grad((g1 * g1).sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad((g2 * w).sum(), x)
        return g3

    np.testing.assert_allclose(third(f).numpy(), third(ref).numpy(), rtol=1e-9, atol=1e-12)
