"""softdot's 16-bit softmax next to torch's own: time ratios per row length,
one thread and all cores, and an accuracy table beside them.

    python bench/python/softmax16_peers.py [--threads 1 --threads 2] [--quick]

For bfloat16 and float16 rows of n = 1k, 4k, 32k and 256k (N(0, 2) scores,
2^20 elements per call: 1024, 256, 32 and 4 rows), the best of 5 timed loops
(>= 0.1 s each) of softdot.softmax(x, out=y) (default and precision="fast")
and of torch.softmax(x, -1),
the same torch tensor, in a child process per thread count
(OMP_NUM_THREADS for softdot's OpenMP, torch.set_num_threads for torch).
"torch / softdot" > 1 means softdot is faster.

Accuracy: against the float64 softmax of the same 16-bit inputs, the max
error in units of the 16-bit format's spacing (ulp) and the fraction of
weights that are not the float64 value rounded once to the format.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from bench_softdot import best_time, cpu_model  # beside this script

LENGTHS = [1024, 4096, 32768, 262144]
ELEMENTS = 1 << 20


def child(threads: int, quick: bool) -> dict:
    import torch

    import softdot

    torch.set_num_threads(threads)
    if os.environ.get("SOFTDOT_BENCH_TARGET"):
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    mt = 0.05 if quick else 0.1
    rng = np.random.default_rng(1)
    res = []
    for name, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        for n in LENGTHS:
            rows = max(1, ELEMENTS // n)
            x = torch.from_numpy(rng.standard_normal((rows, n), dtype=np.float32) * 2).to(tdt)
            y = torch.empty_like(x)
            ts = best_time(lambda: softdot.softmax(x, out=y), mt)
            tf = best_time(lambda: softdot.softmax(x, out=y, precision="fast"), mt)
            tt = best_time(lambda: torch.softmax(x, -1), mt)
            res.append(
                {"dtype": name, "n": n, "rows": rows, "softdot": ts, "fast": tf, "torch": tt}
            )
    return {"threads": threads, "timing": res}


def rounded(ref: np.ndarray, dt) -> np.ndarray:
    """float64 rounded once to the 16-bit dtype (round to odd to float32)."""
    f = ref.astype(np.float32)
    u = f.view(np.uint32).copy()
    inexact = f.astype(np.float64) != ref
    u[inexact & (np.abs(f.astype(np.float64)) > np.abs(ref))] -= 1
    u[inexact] |= 1
    return u.view(np.float32).astype(dt)


def spacing(v: np.ndarray, bf16: bool) -> np.ndarray:
    mant, emin = (7, -126) if bf16 else (10, -14)
    e = np.maximum(np.floor(np.log2(np.maximum(np.abs(v), 1e-300))), emin)
    return np.ldexp(1.0, (e - mant).astype(int))


def accuracy() -> list:
    import ml_dtypes
    import torch

    import softdot

    rng = np.random.default_rng(2)
    out = []
    cases = [
        ("N(0, 2), 64 x 4096", lambda: rng.standard_normal((64, 4096)) * 2),
        ("N(0, 5), 8 x 32768", lambda: rng.standard_normal((8, 32768)) * 5),
        ("uniform, 4 x 512", lambda: np.zeros((4, 512))),
        ("U[-10, 10] + 1000, 64 x 1000", lambda: rng.uniform(-10, 10, (64, 1000)) + 1000),
    ]
    for name, dt, tdt in (
        ("bfloat16", np.dtype(ml_dtypes.bfloat16), torch.bfloat16),
        ("float16", np.dtype(np.float16), torch.float16),
    ):
        for label, make in cases:
            x = make().astype(dt)
            xd = x.astype(np.float64)
            e = np.exp(xd - xd.max(-1, keepdims=True))
            ref = e / e.sum(-1, keepdims=True)
            want = rounded(ref, dt)
            sp = spacing(ref, name == "bfloat16")
            xt = torch.from_numpy(x.view(np.int16)).view(tdt)
            row = {"dtype": name, "case": label}
            for who, y in (
                ("softdot", softdot.softmax(x)),
                ("fast", softdot.softmax(x, precision="fast")),
                ("torch", torch.softmax(xt, -1).view(torch.int16).numpy().view(dt)),
            ):
                err = np.abs(y.astype(np.float64) - ref) / sp
                row[who] = (
                    float(err.max()),
                    float(np.mean(y.view(np.uint16) != want.view(np.uint16))),
                )
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", type=int)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.quick)))
        return
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    runs = []
    for th in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(th))
        cmd = [sys.executable, __file__, "--child", str(th)] + (["--quick"] if args.quick else [])
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    import torch

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    print(
        f"CPU: {cpu_model()}; softdot {softdot.__version__} target {softdot.simd_target()}; "
        f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})\n"
    )
    for r in runs:
        print(f"### 16-bit softmax, {r['threads']} thread(s), 2^20 elements per call")
        print(
            "| dtype | n | rows | softdot ms | fast ms | torch ms | torch / softdot "
            "| torch / fast |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for c in r["timing"]:
            print(
                f"| {c['dtype']} | {c['n']} | {c['rows']} | {c['softdot'] * 1e3:.3f} | "
                f"{c['fast'] * 1e3:.3f} | {c['torch'] * 1e3:.3f} | "
                f"{c['torch'] / c['softdot']:.2f} | {c['torch'] / c['fast']:.2f} |"
            )
        print()
    print("### Accuracy against float64 (max error in 16-bit ulps; fraction not correctly rounded)")
    print(
        "| dtype | case | softdot max ulp | softdot not CR | fast max ulp | fast not CR "
        "| torch max ulp | torch not CR |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for a in accuracy():
        s, f, t = a["softdot"], a["fast"], a["torch"]
        print(
            f"| {a['dtype']} | {a['case']} | {s[0]:.3f} | {s[1]:.2e} | {f[0]:.3f} | {f[1]:.2e} "
            f"| {t[0]:.3f} | {t[1]:.2e} |"
        )


if __name__ == "__main__":
    main()
