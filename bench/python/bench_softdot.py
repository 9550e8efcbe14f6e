"""softdot from Python next to what a numpy or PyTorch user would call instead,
timed in one process on the same arrays.

    python bench/python/bench_softdot.py            # 1 thread, then all threads
    python bench/python/bench_softdot.py --threads 1 --quick

Softmax (float32, last axis): softdot (faithful, the default, and fast), the
seed's numpy formula ``e = exp(x - max); e / sum(e)``, scipy.special.softmax
and torch.softmax. Attention (float32): softdot.scaled_dot_product_attention
against torch 2.x's F.scaled_dot_product_attention, prefill (L = S) and
decode (L = 1, grouped-query heads). Then the binding's own cost: a Python
call against the same C++ call timed in a C++ loop on the same arrays
(softdot._softdot_bench.time_cpp). That module is not in the shipped wheel;
build the package with it to get this table (it is skipped, with a note,
otherwise):

    pip install . -C cmake.define.SOFTDOT_PYTHON_BENCH=ON

Each figure is the best of 5 timed loops of >= 0.1 s (the minimum is the
least disturbed by the other work on a shared machine). Ratios are taken
within one run; the CPU and the SIMD target are printed first
(SOFTDOT_BENCH_TARGET=AVX2 measures the AVX2 code on an AVX-512 machine). A thread count
is set by running the case in a child process with OMP_NUM_THREADS (softdot's
OpenMP) and torch.set_num_threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from report_writer import md_table, write_json  # beside this script

BENCH_HOOKS_MISSING = (
    "skipped: softdot._softdot_bench is not installed "
    "(pip install . -C cmake.define.SOFTDOT_PYTHON_BENCH=ON)"
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def best_time(f, min_time: float = 0.1, repeats: int = 5) -> float:
    """Seconds per call: the best of `repeats` loops of at least min_time."""
    f()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        dt = time.perf_counter() - t0
        if dt >= min_time / 4 or n >= 1 << 24:
            break
        n *= 4
    n = max(1, int(n * (min_time / max(dt, 1e-9))))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def run_cases(threads: int, quick: bool) -> dict:
    """Runs in the child process whose OMP_NUM_THREADS is already set."""
    import numpy as np
    import scipy.special
    import torch
    import torch.nn.functional as F

    import softdot

    torch.set_num_threads(threads)
    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # e.g. AVX2 on an AVX-512 machine
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    rng = np.random.default_rng(1)
    mt = 0.05 if quick else 0.1
    out = {"threads": threads, "softmax": [], "attention": [], "binding": []}

    def naive(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    shapes = [(1, 3), (1, 4096), (64, 1024), (4096, 1024), (256, 32000)]
    if quick:
        shapes = shapes[:3]
    for rows, n in shapes:
        x = rng.standard_normal((rows, n), dtype=np.float32) * 4
        xt = torch.from_numpy(x)
        y = np.empty_like(x)
        ref = naive(x.astype(np.float64))
        for name, f in (
            ("softdot", lambda: softdot.softmax(x, out=y)),
            ("softdot fast", lambda: softdot.softmax(x, precision="fast", out=y)),
            ("numpy (seed formula)", lambda: naive(x)),
            ("scipy.special.softmax", lambda: scipy.special.softmax(x, axis=-1)),
            ("torch.softmax", lambda: torch.softmax(xt, dim=-1)),
        ):
            r = f()
            r = np.asarray(r if not isinstance(r, torch.Tensor) else r.numpy())
            err = float(np.max(np.abs(r - ref) / ref))
            t = best_time(f, mt)
            out["softmax"].append(
                {
                    "shape": [rows, n],
                    "impl": name,
                    "seconds": t,
                    "ns_per_element": t / (rows * n) * 1e9,
                    "max_rel_err": err,
                }
            )

    att = [
        ("prefill", 1, 8, 8, 1024, 1024, 64, False),
        ("prefill causal", 1, 8, 8, 1024, 1024, 64, True),
        ("prefill", 1, 8, 8, 1024, 1024, 128, False),
        ("decode GQA", 1, 32, 8, 1, 4096, 128, False),
    ]
    if quick:
        att = att[:1] + att[-1:]
    for label, B, Hq, Hkv, L, S, E, causal in att:
        q = rng.standard_normal((B, Hq, L, E), dtype=np.float32)
        k = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
        o = torch.empty((B, Hq, L, E))
        mask = None
        if causal:  # bottom-right = top-left here (L == S)
            mask = torch.ones(L, S, dtype=torch.bool).tril(S - L)

        def sd():
            return softdot.scaled_dot_product_attention(qt, kt, vt, causal=causal, out=o)

        def tc():
            if Hq != Hkv:
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)

        a, b = sd().clone(), tc()
        diff = float((a - b).abs().max())
        flops = 4.0 * B * Hq * L * S * E * (0.5 if causal else 1.0)
        kv_bytes = 2.0 * B * Hkv * S * E * 4
        for name, f in (("softdot", sd), ("torch SDPA", tc)):
            t = best_time(f, mt)
            out["attention"].append(
                {
                    "case": f"{label} B{B} Hq{Hq} Hkv{Hkv} L{L} S{S} E{E}",
                    "impl": name,
                    "seconds": t,
                    "gflops": flops / t / 1e9,
                    "kv_gbs": kv_bytes / t / 1e9,
                    "max_abs_diff": diff,
                }
            )

    # The binding's own cost: Python call minus the same C++ call, same arrays.
    try:
        from softdot import _softdot_bench
    except ImportError:
        out["binding_skipped"] = BENCH_HOOKS_MISSING
        return out
    for n in (3, 64):
        x2 = rng.standard_normal((1, n), dtype=np.float32)
        y2 = np.empty_like(x2)
        x1 = x2[0]
        reps = 200000 if not quick else 50000
        cpp = min(_softdot_bench.time_cpp("softmax", x2, y2, reps) for _ in range(5))
        py_new = best_time(lambda: softdot.softmax(x1), mt)
        py_out = best_time(lambda: softdot.softmax(x1, out=y2[0]), mt)
        cpp_dot = min(_softdot_bench.time_cpp("dot", x2, y2, reps) for _ in range(5))
        py_dot = best_time(lambda: softdot.dot(x1, x1), mt)
        xt1 = torch.from_numpy(x1)
        py_torch = best_time(lambda: softdot.softmax(xt1), mt)
        torch_own = best_time(lambda: torch.softmax(xt1, dim=-1), mt)
        out["binding"].append(
            {
                "n": n,
                "cpp_softmax": cpp,
                "py_softmax": py_new,
                "py_softmax_out": py_out,
                "py_softmax_torch": py_torch,
                "torch_softmax": torch_own,
                "cpp_dot": cpp_dot,
                "py_dot": py_dot,
            }
        )
    return out


def report(runs: list, header: dict) -> str:
    lines = [
        f"CPU: {header['cpu']}; softdot {header['version']}, SIMD target {header['target']}; "
        f"numpy {header['numpy']}, scipy {header['scipy']}, torch {header['torch']}",
        "",
    ]
    for r in runs:
        th = r["threads"]
        lines.append(
            f"### Softmax, float32, last axis, {th} thread(s): "
            "ns per element (max rel. error vs float64)"
        )
        lines.append("")
        impls = []
        for e in r["softmax"]:
            if e["impl"] not in impls:
                impls.append(e["impl"])
        cols = ["shape"] + impls + ["best peer / softdot"]
        rows = []
        shapes = []
        for e in r["softmax"]:
            if e["shape"] not in shapes:
                shapes.append(e["shape"])
        for s in shapes:
            row = {e["impl"]: e for e in r["softmax"] if e["shape"] == s}
            peers = [row[i]["seconds"] for i in impls if not i.startswith("softdot")]
            cells = [f"{row[i]['ns_per_element']:.3g} ({row[i]['max_rel_err']:.1e})" for i in impls]
            rows.append(
                [f"{s[0]}x{s[1]}"] + cells + [f"{min(peers) / row['softdot']['seconds']:.2f}"]
            )
        lines += [md_table(cols, rows, text_columns=len(cols)), ""]
        lines.append(f"### Attention, float32, {th} thread(s)")
        lines.append("")
        cols = [
            "case",
            "softdot ms",
            "torch SDPA ms",
            "torch / softdot",
            "softdot GFLOP/s",
            "K+V GB/s",
            "max |diff|",
        ]
        rows = []
        cases = []
        for e in r["attention"]:
            if e["case"] not in cases:
                cases.append(e["case"])
        for c in cases:
            row = {e["impl"]: e for e in r["attention"] if e["case"] == c}
            s, t = row["softdot"], row["torch SDPA"]
            rows.append(
                [
                    c,
                    f"{s['seconds'] * 1e3:.3f}",
                    f"{t['seconds'] * 1e3:.3f}",
                    f"{t['seconds'] / s['seconds']:.2f}",
                    f"{s['gflops']:.1f}",
                    f"{s['kv_gbs']:.1f}",
                    f"{s['max_abs_diff']:.1e}",
                ]
            )
        lines += [md_table(cols, rows, text_columns=len(cols)), ""]
        lines.append(f"### Binding cost per call, {th} thread(s): microseconds")
        lines.append("")
        if r.get("binding_skipped"):
            lines += [r["binding_skipped"], ""]
            continue
        cols = [
            "n",
            "C++ softmax",
            "Python softmax(x)",
            "over C++",
            "softmax(x, out=)",
            "softmax(torch)",
            "torch.softmax",
            "C++ dot",
            "Python dot",
            "over C++",
        ]
        rows = []
        for b in r["binding"]:
            us = {k: v * 1e6 for k, v in b.items() if k != "n"}
            rows.append(
                [b["n"]]
                + [
                    f"{x:.3f}"
                    for x in (
                        us["cpp_softmax"],
                        us["py_softmax"],
                        us["py_softmax"] - us["cpp_softmax"],
                        us["py_softmax_out"],
                        us["py_softmax_torch"],
                        us["torch_softmax"],
                        us["cpp_dot"],
                        us["py_dot"],
                        us["py_dot"] - us["cpp_dot"],
                    )
                ]
            )
        lines += [md_table(cols, rows, text_columns=len(cols)), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--threads",
        type=int,
        action="append",
        help="thread count (repeatable); default: 1 and all cores",
    )
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter loops")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(run_cases(args.child, args.quick)))
        return
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    runs = []
    for th in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(th))
        cmd = [sys.executable, __file__, "--child", str(th)] + (["--quick"] if args.quick else [])
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    import numpy
    import scipy
    import torch

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    header = {
        "cpu": cpu_model(),
        "version": softdot.__version__,
        "target": softdot.simd_target(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "torch": torch.__version__,
    }
    print(report(runs, header))
    if args.json:
        write_json(args.json, {"header": header, "runs": runs})


if __name__ == "__main__":
    main()
