"""softdot.cross_entropy(..., grad=True) against torch's cross_entropy forward
and backward on the same float32 logits, one thread each, best of 5.

    OMP_NUM_THREADS=1 python bench/python/cross_entropy.py [AVX2]

The optional argument restricts softdot to that SIMD target."""

import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import softdot

torch.set_num_threads(1)
if len(sys.argv) > 1:
    softdot.force_simd_target(sys.argv[1])
rng = np.random.default_rng(0)
print(f"softdot target {softdot.simd_target()}, torch {torch.__version__}")
for n, c in [(256, 32000), (64, 128000)]:
    x = torch.from_numpy(rng.standard_normal((n, c)).astype(np.float32) * 3)
    t = torch.from_numpy(rng.integers(0, c, n))
    for eps in (0.0, 0.1):

        def sd():
            return softdot.cross_entropy(x, t, label_smoothing=eps, grad=True)

        def tr():
            xx = x.detach().requires_grad_(True)
            loss = F.cross_entropy(xx, t, label_smoothing=eps)
            loss.backward()
            return loss

        for name, f in (("softdot", sd), ("torch", tr)):
            f()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                f()
                best = min(best, time.perf_counter() - t0)
            print(f"{n}x{c} eps={eps} loss+grad {name:8s} {best * 1e3:7.1f} ms")
