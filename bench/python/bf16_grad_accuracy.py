"""bfloat16 attention gradients under autograd, softdot beside torch's SDPA:
the max |error| of dQ, dK and dV against float64 autograd of the same
bfloat16 values, on each matrix unit softdot has here (the hardware's, the
scalar model, none) and four input distributions (the cases of
tests/python/test_attention_grad.py::test_bfloat16_gradients_at_least_as_accurate_as_torchs:
causal, 1 x 4 x 512 x 72, seed 2120).

    python bench/python/bf16_grad_accuracy.py

Prints one line per unit and distribution: each gradient's error for
softdot and torch, and softdot's relative to the gradient's largest
magnitude.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import softdot

SHAPE = (1, 4, 512, 72)


def problem(dist: str) -> tuple:
    g = torch.Generator().manual_seed(2120)
    draw = {
        "rand": lambda: torch.rand(*SHAPE, generator=g),
        "randn": lambda: torch.randn(*SHAPE, generator=g),
        "offset": lambda: torch.randn(*SHAPE, generator=g) + 3,
        "large": lambda: torch.randn(*SHAPE, generator=g) * 4,
    }[dist]
    q, k, v = (draw().bfloat16() for _ in range(3))
    return q, k, v, torch.rand(*SHAPE, generator=g).bfloat16()


def grads(f, q, k, v, do, dtype):
    ts = [t.detach().clone().to(dtype).requires_grad_() for t in (q, k, v)]
    f(*ts).backward(do.to(dtype))
    return [t.grad.double() for t in ts]


def main() -> None:
    def sdpa(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)

    def ours(a, b, c):
        return softdot.scaled_dot_product_attention(a, b, c, causal=True)

    print(f"torch {torch.__version__}, softdot target {softdot.simd_target()}")
    for unit in softdot.matrix_units():
        softdot.force_matrix_unit(unit)
        try:
            for dist in ("rand", "randn", "offset", "large"):
                q, k, v, do = problem(dist)
                exact = grads(sdpa, q, k, v, do, torch.float64)
                theirs = grads(sdpa, q, k, v, do, torch.bfloat16)
                mine = grads(ours, q, k, v, do, torch.bfloat16)
                cols = []
                for name, m, t, e in zip("qkv", mine, theirs, exact):
                    em, et = float((m - e).abs().max()), float((t - e).abs().max())
                    rel = em / float(e.abs().max())
                    cols.append(f"d{name} {em:.2e} (torch {et:.2e}, rel {rel:.1e})")
                print(f"{unit:10s} {dist:6s} " + "  ".join(cols))
        finally:
            softdot.force_matrix_unit("")


if __name__ == "__main__":
    main()
