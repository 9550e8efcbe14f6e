#!/usr/bin/env python3
"""Prints Markdown tables from softdot_peers' JSON output and draws SVG charts.

(Over 600 lines on purpose: the tables and the charts read the same parsed
results and the same naming rules; the file has no dependency beyond the
standard library, so that a bare Debian python3 runs it.)

Usage: peers_report.py RESULT.json [MORE.json ...] [--svg PATH] [--no-png]
                       [--time real|cpu]

RESULT.json files come from bench/peers/softdot_peers (scripts/peers.sh writes
one for the single-thread run and one for the thread run); medians are used
when repetitions were run. Tables:
  (a) softmax per memory case: time / the 2R+1W loop of the same shape and
      case (lower is better; 1.00 = as fast as reading the input twice and
      writing the output once), ns per element, and time / the copy loop for
      the 2-D shapes;
  (b) dot: GB/s per implementation (argument bytes: 2 x 4 n) and softdot's
      speed over the best peer's;
  (c) dots (one query against n_keys keys of 128 floats): GB/s and softdot's
      speed over cblas_sgemv's;
  (d) softdot's thread scaling, 2 threads against 1;
  (e) attention prefill (one head, float32, n x d, full and causal, 1 and 2
      threads): GFLOP/s at 4 n^2 d (causal: the dense-equivalent rate, same
      numerator), the fraction of the FMA peak measured in the same run (of
      the useful flops: 4 n^2 d, causal 2 n (n + 1) d), and softdot's speed
      over the best peer's;
  (f) attention decode (one query token, 8 query heads on 2 KV heads,
      d = 128, K and V from DRAM): GB/s of K + V, softdot against the
      read-only loop and libtorch.
A benchmark that failed its self-check (or any other error) shows as
"check failed" with the error below the table. Times are wall-clock (real)
by default; --time cpu uses CPU time for the single-thread tables, which
leaves out the time the benchmark waited for the core on a busy machine (the
thread table always uses real time).

Charts: for each memory case, time / 2R+1W against n (log2) for the 1 x n
softmax shapes, one line per implementation: PATH with _cache and _memory
before the extension (default docs/img/softmax_peers.svg gives
docs/img/softmax_peers_cache.svg and docs/img/softmax_peers_memory.svg).
When rsvg-convert (Debian: librsvg2-bin) is installed, PNGs are rendered
beside them unless --no-png is given. Only the Python standard library is
used.
"""
import argparse
import json
import math
import os
import sys

# The tables, charts and files are written by bench/python/report_writer.py,
# the one writer of the benchmark reports (standard library only too).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                "python"))
from report_writer import (  # noqa: E402
    esc, md_bullets, md_table, svg_close, svg_open, svg_series, write_svg)

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}

# Column order and display names.
SOFTMAX_IMPLS = ["softdot", "softdot_fast", "xnnpack", "onednn", "eigen", "libtorch", "pytorch2",
                 "naive"]
# The libraries a user would pick instead (the "fastest peer" of each shape).
SOFTMAX_PEERS = ["xnnpack", "onednn", "eigen", "libtorch", "pytorch2"]
DOT_IMPLS = ["softdot", "openblas", "hwy_dot", "eigen", "naive"]
DOT_PEERS = ["openblas", "hwy_dot", "eigen"]
DOTS_IMPLS = ["softdot", "openblas_sgemv", "eigen", "libtorch"]
NAMES = {
    "softdot": "softdot",
    "softdot_fast": "softdot_fast",
    "xnnpack": "XNNPACK",
    "onednn": "oneDNN",
    "eigen": "Eigen",
    "libtorch": "libtorch",
    "pytorch2": "PyTorch 2",
    "naive": "naive 3-pass",
    "copy": "copy",
    "roofline_2r1w": "2R+1W",
    "openblas": "OpenBLAS sdot",
    "hwy_dot": "Highway Dot",
    "openblas_sgemv": "OpenBLAS sgemv",
    "softdot_rows": "softdot::softmax_rows",
    "softdot_dots": "softdot::dots",
}
# In the dot tables the naive baseline is a single loop.
DOT_NAMES = dict(NAMES, naive="naive loop")
# Attention (bench/peers/attention_cases.cc).
ATTN_IMPLS = ["softdot", "libtorch", "libtorch_sdpa", "openblas_eigen", "naive"]
ATTN_PEERS = ["libtorch", "libtorch_sdpa", "openblas_eigen"]
ATTN_NAMES = dict(NAMES, libtorch="libtorch matmul+softmax+matmul",
                  libtorch_sdpa="libtorch SDPA", openblas_eigen="OpenBLAS sgemm + Eigen softmax",
                  naive="naive loop (n² scores)")
ATTN_MASKS = ["full", "causal"]
DECODE_IMPLS = ["softdot", "libtorch", "read_roofline"]
DECODE_NAMES = dict(NAMES, libtorch="libtorch matmul+softmax+matmul",
                    read_roofline="read-only loop")
DECODE_HEADS, DECODE_KV_HEADS = 8, 2
CASES = ["cache", "memory"]
FAILED = "check failed"


class Result:
    """One benchmark: median real time in ns, or an error message."""

    def __init__(self, ns=None, bytes_per_second=None, error=None, counters=None):
        self.ns = ns
        self.bytes_per_second = bytes_per_second
        self.error = error
        self.counters = counters or {}


def load(paths, time_key="real_time"):
    """Returns ({run_name: Result}, merged context, [source contexts])."""
    results, context, contexts = {}, {}, []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        ctx = data.get("context", {})
        contexts.append(ctx)
        for key, value in ctx.items():
            context.setdefault(key, value)
        benchmarks = data.get("benchmarks", [])
        has_aggregates = any(b.get("run_type") == "aggregate" for b in benchmarks)
        for b in benchmarks:
            run = b.get("run_name", b["name"])
            if b.get("error_occurred"):
                results[run] = Result(error=b.get("error_message", "error"))
                continue
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            if b.get("run_type") == "iteration" and has_aggregates:
                continue
            # Several threads: wall-clock time always (CPU time is the main
            # thread's only).
            multi = run.startswith("threads/") or (
                "/threads:" in run and not run.endswith("/threads:1"))
            key = "real_time" if multi else time_key
            ns = b[key] * UNIT_NS[b.get("time_unit", "ns")]
            # GB/s from the argument bytes of one call and the chosen time
            # (Google Benchmark's bytes_per_second divides by CPU time).
            nbytes = argument_bytes(run)
            bps = nbytes / (ns * 1e-9) if nbytes and ns > 0 else b.get("bytes_per_second")
            results[run] = Result(ns=ns, bytes_per_second=bps, counters=b)
    return results, context, contexts


def argument_bytes(run):
    """Bytes read + written by one call, as softdot_peers counts them."""
    parts = run.split("/")
    if len(parts) < 4:
        return None
    family, shape = parts[0], parts[2]
    dims = [int(p) for p in shape.split("x")]
    if family in ("softmax", "threads") and parts[3] != "softdot_dots":
        return 8 * shape_elements(shape)  # 1 read + 1 write of 4 bytes
    if family == "dot":
        return 8 * dims[0]  # 2 reads
    if family in ("dots", "threads"):
        n_keys, d = dims
        return 4 * (n_keys * d + d + n_keys)
    if family == "decode":
        n_kv, d = dims
        return 4 * 2 * DECODE_KV_HEADS * n_kv * d  # K + V
    return None


def shape_elements(shape):
    """'4096x1024' -> 4194304."""
    n = 1
    for part in shape.split("x"):
        n *= int(part)
    return n


def shapes_of(results, family, case):
    """Shapes present for a family and case, in order of first appearance."""
    seen = []
    for run in results:
        parts = run.split("/")
        if len(parts) >= 4 and parts[0] == family and parts[1] == case and parts[2] not in seen:
            seen.append(parts[2])
    return seen


def fmt_ratio(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_ns(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_gbs(bps):
    return "—" if bps is None else f"{bps / 1e9:.1f}"


def pretty_shape(shape):
    parts = shape.split("x")
    out = []
    for p in parts:
        v = int(p)
        if v >= 1 << 20 and v & (v - 1) == 0:
            out.append(f"2^{v.bit_length() - 1}")
        else:
            out.append(p)
    return "×".join(out)


def cell(results, run, value, errors):
    """Formats value(Result) for a run: '—' if absent, FAILED if errored."""
    r = results.get(run)
    if r is None:
        return "—"
    if r.error is not None:
        errors.append(f"{run}: {r.error}")
        return FAILED
    return value(r)


def present(results, family, impls):
    """The implementations of impls that appear in the results of a family."""
    found = {run.split("/")[-1] for run in results if run.startswith(family + "/")}
    return [i for i in impls if i in found]


def softmax_tables(results, out):
    impls = present(results, "softmax", SOFTMAX_IMPLS)
    for case in CASES:
        shapes = shapes_of(results, "softmax", case)
        if not shapes:
            continue
        errors = []
        rows, ns_rows, copy_rows = [], [], []
        for shape in shapes:
            base = f"softmax/{case}/{shape}/"
            roof = results.get(base + "roofline_2r1w")
            copy = results.get(base + "copy")
            roof_ns = roof.ns if roof is not None and roof.error is None else None
            copy_ns = copy.ns if copy is not None and copy.error is None else None
            n = shape_elements(shape)

            def rel(denominator):
                return lambda r: fmt_ratio(r.ns / denominator) if denominator else "—"

            row = [pretty_shape(shape)]
            ns_row = [pretty_shape(shape)]
            for impl in impls:
                row.append(cell(results, base + impl, rel(roof_ns), errors))
                ns_row.append(cell(results, base + impl, lambda r: fmt_ns(r.ns / n), []))
            row.append(fmt_ratio(copy_ns / roof_ns) if copy_ns and roof_ns else "—")
            ns_row.append(fmt_ns(copy_ns / n) if copy_ns else "—")
            ns_row.append(fmt_ns(roof_ns / n) if roof_ns else "—")
            rows.append(row)
            ns_rows.append(ns_row)
            if "x" in shape and not shape.startswith("1x"):
                copy_row = [pretty_shape(shape)]
                for impl in impls:
                    copy_row.append(cell(results, base + impl, rel(copy_ns), []))
                copy_rows.append(copy_row)
        names = [NAMES.get(i, i) for i in impls]
        peer_rows = []
        for shape in shapes:
            base = f"softmax/{case}/{shape}/"
            best = None
            for peer in SOFTMAX_PEERS:
                r = results.get(base + peer)
                if r is not None and r.error is None and (best is None or r.ns < best[1]):
                    best = (peer, r.ns)
            if best is None:
                continue
            row = [pretty_shape(shape), NAMES.get(best[0], best[0])]
            for mine in ("softdot", "softdot_fast"):
                r = results.get(base + mine)
                row.append(fmt_ratio(r.ns / best[1]) if r is not None and r.error is None
                           else "—")
            peer_rows.append(row)
        out.append(f"### softmax, {case} case: time / 2R+1W loop (lower is better)\n")
        out.append(md_table(["shape"] + names + ["copy / 2R+1W"], rows))
        out.append(f"\n### softmax, {case} case: ns per element\n")
        out.append(md_table(["shape"] + names + ["copy", "2R+1W"], ns_rows))
        if copy_rows:
            out.append(f"\n### softmax, {case} case: time / copy loop (2-D shapes)\n")
            out.append(md_table(["shape"] + names, copy_rows))
        if peer_rows:
            out.append(f"\n### softmax, {case} case: time / the fastest peer's (lower is better)\n")
            out.append(md_table(["shape", "fastest peer", "softdot", "softdot_fast"], peer_rows))
        if errors:
            out.append("\n" + md_bullets(errors))
        out.append("")


def speed_ratio(results, base, impl, others):
    """softdot's speed over the fastest of `others` (time_best / time_softdot)."""
    mine = results.get(base + impl)
    if mine is None or mine.error is not None:
        return None, None
    best, best_name = None, None
    for other in others:
        r = results.get(base + other)
        if r is not None and r.error is None and (best is None or r.ns < best):
            best, best_name = r.ns, other
    if best is None:
        return None, None
    return best / mine.ns, best_name


def dot_tables(results, out):
    impls = present(results, "dot", DOT_IMPLS)
    peers = [p for p in DOT_PEERS if p in impls]
    for case in CASES:
        sizes = shapes_of(results, "dot", case)
        if not sizes:
            continue
        errors, rows = [], []
        for size in sizes:
            base = f"dot/{case}/{size}/"
            row = [pretty_shape(size)]
            for impl in impls:
                row.append(cell(results, base + impl, lambda r: fmt_gbs(r.bytes_per_second), errors))
            ratio, best = speed_ratio(results, base, "softdot", peers)
            row.append(f"{fmt_ratio(ratio)} ({DOT_NAMES.get(best, best)})" if ratio else "—")
            rows.append(row)
        out.append(f"### dot, {case} case: GB/s (2 x 4n bytes read; higher is better)\n")
        out.append(md_table(["n"] + [DOT_NAMES.get(i, i) for i in impls] +
                         ["softdot speed / best peer"], rows))
        if errors:
            out.append("\n" + md_bullets(errors))
        out.append("")


def dots_tables(results, out):
    impls = present(results, "dots", DOTS_IMPLS)
    for case in CASES:
        shapes = shapes_of(results, "dots", case)
        if not shapes:
            continue
        errors, rows = [], []
        for shape in shapes:
            base = f"dots/{case}/{shape}/"
            row = [pretty_shape(shape)]
            for impl in impls:
                row.append(cell(results, base + impl, lambda r: fmt_gbs(r.bytes_per_second), errors))
            ratio, _ = speed_ratio(results, base, "softdot", ["openblas_sgemv"])
            row.append(fmt_ratio(ratio))
            rows.append(row)
        out.append(f"### dots (one query, keys n_keys × 128), {case} case: GB/s "
                   "(keys + query + scores bytes)\n")
        out.append(md_table(["keys × d"] + [NAMES.get(i, i) for i in impls] +
                         ["softdot speed / sgemv"], rows))
        if errors:
            out.append("\n" + md_bullets(errors))
        out.append("")


def thread_tables(results, out, cpus):
    rows, errors = [], []
    for case in CASES:
        keys = []
        for run in results:
            parts = run.split("/")
            if parts[0] == "threads" and parts[1] == case and len(parts) == 5:
                key = (parts[2], parts[3])
                if key not in keys:
                    keys.append(key)
        for shape, fn in keys:
            base = f"threads/{case}/{shape}/{fn}/threads:"
            t1, t2 = results.get(base + "1"), results.get(base + "2")
            c1 = cell(results, base + "1", lambda r: fmt_ns(r.ns / 1e6), errors)
            c2 = cell(results, base + "2", lambda r: fmt_ns(r.ns / 1e6), errors)
            ok = t1 and t2 and t1.error is None and t2.error is None
            rows.append([case, NAMES.get(fn, fn), pretty_shape(shape), c1, c2,
                         fmt_ratio(t1.ns / t2.ns) if ok else "—"])
    if not rows:
        return
    out.append(f"### thread scaling (OpenMP threads; the run had {cpus} CPUs)\n")
    out.append(md_table(["case", "function", "shape", "1 thread ms", "2 threads ms",
                      "speed-up 2 vs 1"], rows, text_columns=3))
    if errors:
        out.append("\n" + md_bullets(errors))
    out.append("")


def attention_flops(mask, shape):
    """(dense 4 n^2 d, useful) flops of one prefill call."""
    n, d = (int(x) for x in shape.split("x"))
    dense = 4 * n * n * d
    return dense, (2 * n * (n + 1) * d if mask == "causal" else dense)


def attention_keys(results, family):
    """[(mask or case, shape, threads)] present for a family, in order."""
    keys = []
    for run in results:
        parts = run.split("/")
        if len(parts) == 5 and parts[0] == family and parts[4].startswith("threads:"):
            key = (parts[1], parts[2], parts[4].split(":")[1])
            if key not in keys:
                keys.append(key)
    order = {m: i for i, m in enumerate(ATTN_MASKS)}
    return sorted(keys, key=lambda k: (int(k[2]), order.get(k[0], 9),
                                       [int(x) for x in k[1].split("x")]))


def attention_tables(results, out):
    keys = attention_keys(results, "attention")
    if not keys:
        return
    found = {run.split("/")[3] for run in results if run.startswith("attention/")}
    impls = [i for i in ATTN_IMPLS if i in found]
    peers = [p for p in ATTN_PEERS if p in impls]
    errors, rate_rows, peak_rows = [], [], []
    for mask, shape, threads in keys:
        dense, useful = attention_flops(mask, shape)
        label = [mask, pretty_shape(shape), threads]
        rate_row, peak_row = list(label), list(label)
        peak = None
        for impl in impls:
            run = f"attention/{mask}/{shape}/{impl}/threads:{threads}"
            rate_row.append(cell(results, run, lambda r: f"{dense / r.ns:.1f}", errors))
            r = results.get(run)
            p = r.counters.get("peak_GFLOP/s") if r is not None and r.error is None else None
            peak = peak or p
            peak_row.append(cell(results, run, lambda r: fmt_ratio(useful / r.ns / p)
                                 if p else "—", []))

        def runs_of(names):
            return [f"{n}/threads:{threads}" for n in names]

        base = f"attention/{mask}/{shape}/"
        ratio, best = speed_ratio(results, base, f"softdot/threads:{threads}", runs_of(peers))
        best = best.split("/")[0] if best else None
        rate_row.append(f"{fmt_ratio(ratio)} ({ATTN_NAMES.get(best, best)})" if ratio else "—")
        peak_row.append(f"{peak:.0f}" if peak else "—")
        rate_rows.append(rate_row)
        peak_rows.append(peak_row)
    names = [ATTN_NAMES.get(i, i) for i in impls]
    out.append("### attention prefill (one head, float32, n_q = n_kv = n, d = d_v): GFLOP/s at "
               "4·n²·d (causal: dense-equivalent, the same 4·n²·d; higher is better)\n")
    out.append(md_table(["mask", "n × d", "threads"] + names + ["softdot speed / best peer"],
                     rate_rows, text_columns=3))
    out.append("\n### attention prefill: fraction of the FMA peak (useful flops: 4·n²·d, causal "
               "2·n·(n+1)·d; peak of as many cores, measured in the same run)\n")
    out.append(md_table(["mask", "n × d", "threads"] + names + ["peak GFLOP/s"], peak_rows,
                     text_columns=3))
    if errors:
        out.append("\n" + md_bullets(errors))
    out.append("")


def decode_tables(results, out):
    keys = attention_keys(results, "decode")
    if not keys:
        return
    found = {run.split("/")[3] for run in results if run.startswith("decode/")}
    impls = [i for i in DECODE_IMPLS if i in found]
    errors, rows = [], []
    for case, shape, threads in keys:
        base = f"decode/{case}/{shape}/"
        t = f"/threads:{threads}"
        row = [pretty_shape(shape), threads]
        for impl in impls:
            row.append(cell(results, base + impl + t, lambda r: fmt_gbs(r.bytes_per_second),
                            errors))
        mine, roof = results.get(base + "softdot" + t), results.get(base + "read_roofline" + t)
        ok = mine is not None and mine.error is None
        row.append(fmt_ratio(roof.ns / mine.ns) if ok and roof and roof.error is None else "—")
        ratio, _ = speed_ratio(results, base, "softdot" + t, ["libtorch" + t])
        row.append(fmt_ratio(ratio))
        rows.append(row)
    out.append(f"### attention decode (n_q = 1, {DECODE_HEADS} query heads on {DECODE_KV_HEADS} "
               "KV heads, d = 128, float32; K and V from DRAM): GB/s of K + V (higher is "
               "better)\n")
    out.append(md_table(["n_kv × d", "threads"] + [DECODE_NAMES.get(i, i) for i in impls] +
                     ["softdot / read loop", "softdot speed / libtorch"], rows, text_columns=2))
    if errors:
        out.append("\n" + md_bullets(errors))
    out.append("")


def header(context, contexts, time_name):
    def get(key):
        return context.get(key, "?")

    lines = [
        f"softdot_peers: softdot {get('softdot_version')}, SIMD target {get('simd_target')}",
    ]
    for ctx in contexts:
        if "peers_set" not in ctx:
            continue  # a file of softmax_torch2.py: its lines come below
        lines.append(
            f"run ({ctx.get('peers_set', '?')}): affinity CPUs {ctx.get('affinity_cpus', '?')}, "
            f"OpenMP max threads {ctx.get('omp_max_threads', '?')}, "
            f"{ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz, "
            f"load avg {', '.join(f'{x:.2f}' for x in ctx.get('load_avg', []))}, {ctx.get('date', '?')}")
    lines.append("single-thread benchmarks: OpenMP, OpenBLAS and libtorch set to 1 thread; "
                 f"times: {time_name}")
    versions = [
        ("XNNPACK", "xnnpack_version"), ("oneDNN", "onednn_version"),
        ("oneDNN ISA", "onednn_cpu_isa"), ("Eigen", "eigen_version"), ("Eigen ISA", "eigen_isa"),
        ("libtorch", "torch_version"), ("libtorch CPU capability", "torch_cpu_capability"),
        ("OpenBLAS", "openblas_config"), ("Highway Dot target", "hwy_dot_target"),
        ("PyTorch 2 from Python (bench/python/softmax_torch2.py): call cost subtracted, ns",
         "pytorch2_call_ns"),
        ("PyTorch 2 version", "pytorch2_version"),
        ("PyTorch 2 CPU capability", "pytorch2_cpu_capability"),
    ]
    for label, key in versions:
        if key in context:
            lines.append(f"{label}: {context[key]}")
    return md_bullets(lines)


# ---- SVG ---------------------------------------------------------------------
COLORS = {
    "softdot": "#d62728", "softdot_fast": "#ff7f0e", "xnnpack": "#1f77b4", "onednn": "#2ca02c",
    "eigen": "#9467bd", "libtorch": "#8c564b", "pytorch2": "#e377c2", "naive": "#7f7f7f",
    "copy": "#17becf",
}


def y_ticks(lo, hi):
    """Tick values 1, 2, 5 x 10^k covering [lo, hi] on a log scale."""
    ticks = []
    k = math.floor(math.log10(lo))
    while True:
        for m in (1, 2, 5):
            v = m * 10.0 ** k
            if v > hi * 1.0001:
                return ticks
            if v >= lo * 0.9999:
                ticks.append(v)
        k += 1


def svg_chart(results, case, context):
    """An SVG string (or None) of time / 2R+1W against log2(n) for 1 x n shapes."""
    impls = present(results, "softmax", SOFTMAX_IMPLS + ["copy"])
    series = {}
    for shape in shapes_of(results, "softmax", case):
        rows, _, n = shape.partition("x")
        if rows != "1":
            continue
        n = int(n)
        roof = results.get(f"softmax/{case}/{shape}/roofline_2r1w")
        if roof is None or roof.error is not None:
            continue
        for impl in impls:
            r = results.get(f"softmax/{case}/{shape}/{impl}")
            if r is not None and r.error is None:
                series.setdefault(impl, []).append((math.log2(n), r.ns / roof.ns))
    if not series:
        return None
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts] + [1.0]
    x_lo, x_hi = math.floor(min(xs)), math.ceil(max(xs))
    y_lo = 10 ** (math.floor(math.log10(min(ys)) * 4) / 4)
    y_hi = 10 ** (math.ceil(math.log10(max(ys)) * 4) / 4)
    width, height = 900, 560
    left, right, top, bottom = 80, 190, 60, 70
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (x - x_lo) / max(x_hi - x_lo, 1e-9) * pw

    def py(y):
        return top + (math.log10(y_hi) - math.log10(y)) / (math.log10(y_hi) - math.log10(y_lo)) * ph

    target = context.get("simd_target", "?")
    title = (f"softmax 1×n, {case} case: time / 2R+1W loop "
             f"(single thread, SIMD target {target})")
    s = svg_open(width, height, 13)
    s.append(f'<text x="{width / 2:.0f}" y="28" text-anchor="middle" font-size="16" '
             f'font-weight="bold">{esc(title)}</text>')
    # Grid and ticks.
    for v in y_ticks(y_lo, y_hi):
        y = py(v)
        s.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" '
                 f'stroke="#e0e0e0"/>')
        label = f"{v:g}"
        s.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    step = 2 if x_hi - x_lo <= 16 else 4
    for k in range(int(x_lo), int(x_hi) + 1):
        x = px(k)
        s.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" '
                 f'stroke="{"#e0e0e0" if k % step == 0 else "#f4f4f4"}"/>')
        if k % step == 0:
            s.append(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle">'
                     f'2<tspan dy="-6" font-size="10">{k}</tspan></text>')
    # The 2R+1W loop itself: y = 1.
    s.append(f'<line x1="{left}" y1="{py(1.0):.1f}" x2="{left + pw}" y2="{py(1.0):.1f}" '
             f'stroke="black" stroke-dasharray="6,4"/>')
    s.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    s.append(f'<text x="{left + pw / 2:.0f}" y="{height - 20}" text-anchor="middle">'
             f'n (elements per row, log2 scale)</text>')
    s.append(f'<text transform="translate(22,{top + ph / 2:.0f}) rotate(-90)" '
             f'text-anchor="middle">time / 2R+1W loop (log scale; lower is faster)</text>')
    # Lines.
    legend = []
    for impl in SOFTMAX_IMPLS + ["copy"]:
        pts = sorted(series.get(impl, []))
        if not pts:
            continue
        color = COLORS.get(impl, "#000000")
        dash = ' stroke-dasharray="3,3"' if impl in ("copy", "naive") else ""
        width_px = 3 if impl.startswith("softdot") else 2
        s += svg_series([(px(x), py(y)) for x, y in pts], color, width_px, dash)
        legend.append((NAMES.get(impl, impl) + (" loop" if impl == "copy" else ""), color, dash,
                       width_px))
    legend.append(("2R+1W loop (= 1)", "black", ' stroke-dasharray="6,4"', 1))
    lx, ly = left + pw + 20, top + 10
    for i, (label, color, dash, width_px) in enumerate(legend):
        y = ly + i * 22
        s.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 28}" y2="{y}" stroke="{color}" '
                 f'stroke-width="{width_px}"{dash}/>')
        s.append(f'<text x="{lx + 36}" y="{y + 4}">{esc(label)}</text>')
    return svg_close(s)


def write_charts(results, context, svg_path, png):
    root, ext = os.path.splitext(svg_path)
    written = []
    for case in CASES:
        svg = svg_chart(results, case, context)
        if svg is None:
            continue
        written += write_svg(f"{root}_{case}{ext or '.svg'}", svg, png)
    return written


def main():
    default_svg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "img",
                               "softmax_peers.svg")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", nargs="+", help="softdot_peers --benchmark_out files")
    parser.add_argument("--svg", default=os.path.normpath(default_svg),
                        help="chart path; _cache / _memory go before the extension")
    parser.add_argument("--no-png", action="store_true", help="do not render PNGs")
    parser.add_argument("--time", choices=["real", "cpu"], default="real",
                        help="time of the single-thread tables (default: real)")
    args = parser.parse_args()
    paths = [p for p in args.json if os.path.exists(p) and os.path.getsize(p) > 0]
    if not paths:
        sys.exit("peers_report.py: no results (" + ", ".join(args.json) + ")")
    results, context, contexts = load(paths, "cpu_time" if args.time == "cpu" else "real_time")
    out = [header(context, contexts, "CPU time" if args.time == "cpu" else
                  "wall-clock (real) time"), ""]
    softmax_tables(results, out)
    dot_tables(results, out)
    dots_tables(results, out)
    thread_cpus = next((c.get("affinity_cpus") for c in contexts
                        if c.get("peers_set") in ("threads", "all")), "?")
    thread_tables(results, out, thread_cpus)
    attention_tables(results, out)
    decode_tables(results, out)
    print("\n".join(out))
    for path in write_charts(results, context, args.svg, not args.no_png):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
