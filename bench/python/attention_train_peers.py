"""Attention for training: forward + backward, softdot next to torch SDPA,
side by side in one process per thread count; and the gradients' accuracy.

    python bench/python/attention_train_peers.py --threads 1,2
    python bench/python/attention_train_peers.py --threads 1 --filter 'n1024'
    python bench/python/attention_train_peers.py --accuracy
    python bench/python/attention_train_peers.py --memory
    python bench/python/attention_train_peers.py --full      # n = 8192 and B4 H32 too
    SOFTDOT_BENCH_TARGET=AVX2 python bench/python/attention_train_peers.py --filter B1
        (softdot's AVX2 code on an AVX-512 machine; --accuracy honours it too)

Speed: for each case (batch B, query heads H on Hkv KV heads, n = L = S, head
dimension d, causal or not) the time of ``out = attn(q, k, v); out.backward(do)``
on float32 tensors that require grad, the best of a few runs, for
softdot.scaled_dot_product_attention (its backward is attention_backward) and
torch.nn.functional.scaled_dot_product_attention (the CPU flash-attention
kernels), with the same thread count for both (torch.set_num_threads and
OpenMP). GFLOP/s counts 4 B H n^2 d for the forward (half with causal) and
2.5 times that for the backward; "of mm" divides by torch.mm's GFLOP/s on
2048 x 2048 float32 at that thread count (the matrix-product roofline this
machine reaches).

Accuracy (--accuracy): each gradient's max |g - g64| over max |g64|, g64 torch
float64 autograd of the same (float32, or bfloat16) inputs, for softdot and
torch side by side, and their ratio. Cases: Q, K, V ~ N(0, 1); scores ~ N(0, 3)
(Q, K scaled by sqrt(3)); V offset by +100 (the values' mean dwarfs their
spread); causal and not, with GQA.

Memory (--memory): peak resident memory beyond the inputs and gradients of
one forward + backward at n = 8192 (B1 H8 d64), each implementation in a
fresh process (ru_maxrss after minus before).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

Case = Tuple[int, int, int, int, int, bool]  # B, H, Hkv, n, d, causal


def cases(full: bool) -> List[Case]:
    out: List[Case] = []
    for B, H, Hkv in ((1, 8, 8), (4, 32, 8)):
        for n in (1024, 4096, 8192):
            if not full and (n == 8192 or (B == 4 and n > 1024)):
                continue
            for d in (64, 128):
                for causal in (False, True):
                    out.append((B, H, Hkv, n, d, causal))
    return out


def name(c: Case) -> str:
    B, H, Hkv, n, d, causal = c
    return f"B{B} H{H}/{Hkv} n{n} d{d}{' causal' if causal else ''}"


def flops(c: Case) -> float:
    B, H, _, n, d, causal = c
    f = 4.0 * B * H * n * n * d * (0.5 if causal else 1.0)
    return f * 3.5  # forward + backward (2.5x)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def best(fn: Any, reps: int) -> float:
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def speed(threads: int, filt: str, full: bool) -> List[Dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # e.g. AVX2 on an AVX-512 machine
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    torch.set_num_threads(threads)
    a = torch.randn(2048, 2048)
    mm = best(lambda: torch.mm(a, a), 5)
    mm_gf = 2 * 2048**3 / mm / 1e9
    print(f"# threads {threads}: torch.mm 2048^2 float32 {mm_gf:.0f} GFLOP/s", flush=True)
    print(f"{'case':34} {'softdot ms':>11} {'torch ms':>9} {'ratio':>6} {'GF/s':>6} {'of mm':>6}")
    rows = []
    for c in cases(full):
        if filt and filt not in name(c):
            continue
        B, H, Hkv, n, d, causal = c
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, H, n, d, generator=g).requires_grad_()
        k = torch.randn(B, Hkv, n, d, generator=g).requires_grad_()
        v = torch.randn(B, Hkv, n, d, generator=g).requires_grad_()
        do = torch.randn(B, H, n, d, generator=g)
        gqa = H != Hkv

        def ours() -> None:
            softdot.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)

        def theirs() -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa).backward(do)

        reps = 3 if flops(c) < 2e10 else 1
        t_s = best(ours, reps)
        t_t = best(theirs, reps)
        gf = flops(c) / t_s / 1e9
        row = {
            "case": name(c),
            "threads": threads,
            "softdot_ms": t_s * 1e3,
            "torch_ms": t_t * 1e3,
            "ratio": t_t / t_s,
            "softdot_gflops": gf,
            "of_mm": gf / mm_gf,
        }
        rows.append(row)
        print(
            f"{name(c):34} {t_s * 1e3:11.1f} {t_t * 1e3:9.1f} {t_t / t_s:6.2f} {gf:6.0f} "
            f"{gf / mm_gf:6.2f}",
            flush=True,
        )
    return rows


def rel_err(got: Any, want: Any) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-300))


def accuracy() -> List[Dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    rows = []
    print(f"{'case':40} {'grad':5} {'softdot':>9} {'torch':>9} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        for label, qk, voff in (
            ("N(0,1)", 1.0, 0.0),
            ("scores N(0,3)", math.sqrt(3), 0.0),
            ("V+100", 1.0, 100.0),
        ):
            for causal in (False, True):
                B, H, Hkv, n, d = 1, 4, 2, 256, 64
                g = torch.Generator().manual_seed(1)
                q0 = torch.randn(B, H, n, d, generator=g) * qk
                k0 = torch.randn(B, Hkv, n, d, generator=g) * qk
                v0 = torch.randn(B, Hkv, n, d, generator=g) + voff
                do = torch.randn(B, H, n, d, generator=g)
                base = [t.to(dtype) for t in (q0, k0, v0)]
                dd = do.to(dtype)

                def grads(fn: Any, ts: List[Any], dout: Any) -> List[Any]:
                    ts = [t.detach().clone().requires_grad_() for t in ts]
                    fn(*ts).backward(dout)
                    return [t.grad for t in ts]

                ref = grads(
                    lambda a, b, c: F.scaled_dot_product_attention(
                        a, b, c, is_causal=causal, enable_gqa=True
                    ),
                    [t.double() for t in base],
                    dd.double(),
                )
                ours = grads(
                    lambda a, b, c: softdot.scaled_dot_product_attention(a, b, c, is_causal=causal),
                    base,
                    dd,
                )
                theirs = grads(
                    lambda a, b, c: F.scaled_dot_product_attention(
                        a, b, c, is_causal=causal, enable_gqa=True
                    ),
                    base,
                    dd,
                )
                dt = "f32" if dtype == torch.float32 else "bf16"
                for gname, o, t, r in zip(("dq", "dk", "dv"), ours, theirs, ref):
                    eo, et = rel_err(o, r), rel_err(t, r)
                    case = f"{dt} {label}{' causal' if causal else ''}"
                    rows.append(
                        {
                            "case": case,
                            "grad": gname,
                            "softdot": eo,
                            "torch": et,
                            "ratio": eo / et if et else 0.0,
                        }
                    )
                    print(
                        f"{case:40} {gname:5} {eo:9.2e} {et:9.2e} {eo / et if et else 0:6.2f}",
                        flush=True,
                    )
    return rows


_MEM_CHILD = """
import resource, sys, torch
impl = sys.argv[1]
torch.set_num_threads(1)
n, d, H = 8192, 64, 8
g = torch.Generator().manual_seed(0)
q = torch.randn(1, H, n, d, generator=g).requires_grad_()
k = torch.randn(1, H, n, d, generator=g).requires_grad_()
v = torch.randn(1, H, n, d, generator=g).requires_grad_()
do = torch.randn(1, H, n, d, generator=g)
grads = [torch.zeros_like(t) for t in (q, k, v)]
out = torch.zeros_like(do)
import softdot, torch.nn.functional as F
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
f = softdot.scaled_dot_product_attention if impl == "softdot" else F.scaled_dot_product_attention
f(q, k, v, is_causal=True).backward(do)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) / 1024.0)
"""


def memory() -> Dict[str, float]:
    res = {}
    inputs = 4 * 8 * 8192 * 64 * 4 / 2**20  # q, k, v, do in MiB
    for impl in ("softdot", "torch"):
        out = subprocess.run(
            [sys.executable, "-c", _MEM_CHILD, impl],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        res[impl] = float(out.stdout.strip().splitlines()[-1])
    n2 = 8 * 8192 * 8192 * 4 / 2**20
    print(
        f"n = 8192, B1 H8 d64 causal, 1 thread: peak RSS growth softdot {res['softdot']:.0f} MiB, "
        f"torch {res['torch']:.0f} MiB (inputs {inputs:.0f} MiB; one n x n float32 score "
        f"matrix per head would be {n2:.0f} MiB)"
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", default="1")
    ap.add_argument("--filter", default="")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    print(f"# {cpu_model()}")
    result: Dict[str, Any] = {"cpu": cpu_model()}
    if args.child:
        rows = speed(args.child, args.filter, args.full)
        print("JSON " + json.dumps(rows))
        return
    if args.accuracy:
        result["accuracy"] = accuracy()
    elif args.memory:
        result["memory"] = memory()
    else:
        import softdot

        if os.environ.get("SOFTDOT_BENCH_TARGET"):
            softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
        print(f"# softdot target {softdot.simd_target()}")
        result["speed"] = []
        for t in [int(x) for x in args.threads.split(",")]:
            cmd = [sys.executable, __file__, "--child", str(t), "--filter", args.filter]
            if args.full:
                cmd.append("--full")
            env = dict(os.environ, OMP_NUM_THREADS=str(t))
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            for line in p.stdout.splitlines():
                if line.startswith("JSON "):
                    result["speed"] += json.loads(line[5:])
                elif not line.startswith("# ") or "threads" in line:
                    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
