"""PyTorch 2.x's softmax on the shapes of the peers benchmark, written as a
results file that scripts/peers_report.py reads beside softdot_peers' own.

    python bench/python/softmax_torch2.py --out torch2.json [--min-time 0.1]
        [--repetitions 3] [--filter REGEX]

softdot_peers (C++) links Debian's libtorch 1.13; a user today calls
torch.softmax from PyTorch 2.x. This script times torch.softmax(x, -1,
out=y) on float32 rows drawn as softdot_peers draws its scores (N(0, 2),
seeded), single-threaded (torch.set_num_threads(1)), for the `cache` case
(one buffer, reused) and the `memory` case (1 x 2^24: each call takes the
next of rotating copies, 512 MiB of inputs in all, so the input comes from
DRAM, as softdot_peers' 512 MiB arenas do).

A call from Python costs a few microseconds that the C++ peers do not pay.
The figure written as `pytorch2` is the measured time less that cost, taken
as the time of the same call on a 1 x 1 row (the smallest work torch does on
that path); the raw time is written as `pytorch2_raw`. Both are medians of
--repetitions timed loops of at least --min-time seconds each (the run
structure of Google Benchmark's --benchmark_repetitions). The CPU model,
torch's version and its CPU capability (ATen's dispatch: AVX512 or AVX2; set
ATEN_CPU_CAPABILITY=avx2 to force AVX2) go into the file's context.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import numpy as np
import torch
from bench_softdot import cpu_model  # beside this script
from report_writer import write_json

CACHE_SHAPES = [
    (1, 3),
    (1, 8),
    (1, 16),
    (1, 64),
    (1, 1000),
    (1, 4096),
    (1, 65536),
    (4096, 1024),
    (256, 32000),
]
MEMORY_SHAPES = [(1, 1 << 24)]
MEMORY_ARENA_BYTES = 512 << 20


def timed_loop(call, min_time: float) -> float:
    """Seconds per call of a loop that runs at least min_time seconds."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return dt / n
        n = max(n * 2, int(n * min_time / max(dt, 1e-9) * 1.2))


def median_time(call, min_time: float, reps: int) -> float:
    call()  # warm-up: allocations, first-touch, dispatch caches
    return statistics.median(timed_loop(call, min_time) for _ in range(reps))


def rows_of(shape, seed):
    rng = np.random.default_rng(seed)
    return torch.from_numpy((2.0 * rng.standard_normal(size=shape)).astype(np.float32))


def entry(name: str, seconds: float, elements: int, reps: int) -> dict:
    ns = seconds * 1e9
    return {
        "name": name + "_median",
        "run_name": name,
        "run_type": "aggregate",
        "aggregate_name": "median",
        "repetitions": reps,
        "threads": 1,
        "iterations": reps,
        "real_time": ns,
        "cpu_time": ns,
        "time_unit": "ns",
        "items_per_second": elements / seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results file (JSON)")
    p.add_argument("--min-time", type=float, default=0.1)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--filter", default="", help="regular expression on the benchmark names")
    args = p.parse_args()
    torch.set_num_threads(1)
    pick = re.compile(args.filter)
    reps = args.repetitions

    tiny = rows_of((1, 1), 0)
    tiny_out = torch.empty_like(tiny)
    overhead = median_time(lambda: torch.softmax(tiny, -1, out=tiny_out), args.min_time, reps)

    benchmarks = []
    for case, shapes in (("cache", CACHE_SHAPES), ("memory", MEMORY_SHAPES)):
        for rows, n in shapes:
            name = f"softmax/{case}/{rows}x{n}/pytorch2"
            if not pick.search(name):
                continue
            elements = rows * n
            copies = 1 if case == "cache" else max(2, MEMORY_ARENA_BYTES // (4 * elements))
            xs = [rows_of((rows, n), 17 + i) for i in range(copies)]
            ys = [torch.empty_like(x) for x in xs]
            state = {"i": 0}

            def call(xs=xs, ys=ys, state=state, copies=copies):
                i = state["i"]
                torch.softmax(xs[i], -1, out=ys[i])
                state["i"] = i + 1 if i + 1 < copies else 0

            raw = median_time(call, args.min_time, reps)
            # The result is a softmax: softdot_peers' self-check (max |difference|
            # at most 1e-5, here against float64); a failure is reported as
            # softdot_peers reports one, and the run goes on.
            ref = torch.softmax(xs[0].double(), -1)
            err = float((ys[0].double() - ref).abs().max())
            if not err <= 1e-5:
                message = f"self-check failed: max |pytorch2 - float64| = {err:.6f} > 1e-5"
                print(f"{name}: {message}", flush=True)
                benchmarks.append(
                    {
                        "name": name,
                        "run_name": name,
                        "error_occurred": True,
                        "error_message": message,
                    }
                )
                del xs, ys
                continue
            benchmarks.append(entry(name, max(raw - overhead, 0.0), elements, reps))
            benchmarks.append(entry(name + "_raw", raw, elements, reps))
            print(
                f"{name}: {raw * 1e9:.1f} ns per call, {(raw - overhead) * 1e9 / elements:.3f}"
                f" ns per element net of the call cost",
                flush=True,
            )
            del xs, ys

    context = {
        "pytorch2_version": torch.__version__,
        "pytorch2_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pytorch2_threads": str(torch.get_num_threads()),
        "pytorch2_call_ns": f"{overhead * 1e9:.0f}",
        "pytorch2_cpu": cpu_model(),
    }
    write_json(args.out, {"context": context, "benchmarks": benchmarks})
    print(
        f"wrote {args.out} (call cost {overhead * 1e9:.0f} ns, "
        f"torch {torch.__version__}, {context['pytorch2_cpu_capability']})"
    )


if __name__ == "__main__":
    main()
