#!/usr/bin/env python3
"""Prints a compact table from softdot_bench's JSON output (medians).

Usage: bench_table.py BENCH.json

For each benchmark and size: ns per element, GB/s (argument bytes: inputs read
once + outputs written once, see bench/bench_util.h), and the time ratio to the
2R+1W roofline loop and to the copy loop at the same n (1.00 = as fast; lower is
faster). Only the Python standard library is used.
"""
import json
import sys

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def elements(run_name):
    """BM_x/4096 -> 4096; BM_softmax_rows/4096/1024 -> 4096*1024."""
    n = 1
    for part in run_name.split("/")[1:]:
        n *= int(part)
    return n


def main():
    with open(sys.argv[1]) as f:
        data = json.load(f)
    ctx = data.get("context", {})
    rows = []
    for b in data["benchmarks"]:
        # Keep medians; fall back to plain runs when no repetitions were asked.
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("run_type") == "iteration" and any(
                x.get("run_type") == "aggregate" for x in data["benchmarks"]):
            continue
        run = b.get("run_name", b["name"])
        family = run.split("/")[0].removeprefix("BM_")
        n = elements(run)
        ns = b["real_time"] * UNIT_NS[b.get("time_unit", "ns")]
        rows.append((family, n, run, ns, b.get("bytes_per_second", 0.0)))

    # softdot first, each next to its naive counterpart, then the baselines.
    order = ["dot", "naive_dot", "softmax", "naive_softmax", "softmax_rows",
             "roofline_2r1w", "copy", "memcpy"]
    rows.sort(key=lambda r: (order.index(r[0]) if r[0] in order else len(order), r[1]))
    base = {(fam, n): ns for fam, n, _, ns, _ in rows if fam in ("roofline_2r1w", "copy")}
    print(f"simd_target={ctx.get('simd_target', '?')} threads={ctx.get('omp_max_threads', '?')} "
          f"cpus={ctx.get('num_cpus', '?')} mhz={ctx.get('mhz_per_cpu', '?')} "
          f"benchmark_lib_build={ctx.get('library_build_type', '?')}")
    print(f"{'benchmark':<32} {'n':>9} {'ns/elem':>9} {'GB/s':>8} {'/2R+1W':>7} {'/copy':>7}")
    for fam, n, run, ns, bps in rows:
        def ratio(b):
            t = base.get((b, n))
            return f"{ns / t:7.2f}" if t else f"{'-':>7}"
        print(f"{run:<32} {n:>9} {ns / n:9.4f} {bps / 1e9:8.2f} "
              f"{ratio('roofline_2r1w')} {ratio('copy')}")


if __name__ == "__main__":
    main()
