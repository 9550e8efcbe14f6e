#!/usr/bin/env python3
"""Concurrent Python callers (issue 29, "Concurrency and faults").

T Python threads (default 8) call softdot.softmax, log_softmax,
scaled_dot_product_attention (K/V float32, float16, bfloat16 and int8
pairs; a bfloat16 query; a torch call), paged_attention, cross_entropy
(float32 with its gradient, bfloat16) and linear_cross_entropy on SHARED
inputs, each call writing a fresh output of its own, for --seconds (default
600). softdot releases the GIL while it computes, so the threads' calls
overlap, and OpenMP runs underneath each (set OMP_NUM_THREADS=2 to use both
cores of the test machine; the script sets it when unset).

Every result is compared bit for bit with the result of the same call made
once on the main thread before any worker started. Resident memory (VmRSS
of /proc/self/status) is sampled when every worker has made --warmup-passes
passes over all the calls, and at the end; it is judged flat when the end
exceeds the warm sample by less than --rss-limit-mib (default 8 MiB).

Prints the calls per function and one summary line:
  stress_threads: threads=8 seconds=... calls=... mismatches=0 errors=0
  rss_warm_kib=... rss_end_kib=... growth_mib=... -> OK
Exit status 0 only with no mismatch, no exception and flat memory; with
--json PATH the record is also written there.

Run with the package importable, e.g.
  PYTHONPATH=/tmp/pkg python scripts/stress_threads.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import softdot  # noqa: E402

try:
    import torch
except ImportError:  # the torch call is left out without torch
    torch = None


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def as_bytes(result) -> bytes:
    """Every array of a result (an array, a tuple of them, a scalar), as the
    bytes of its values, in order."""
    if isinstance(result, tuple):
        return b"".join(as_bytes(r) for r in result)
    if torch is not None and isinstance(result, torch.Tensor):
        t = result.detach().contiguous()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.view(torch.int16)
        return t.numpy().tobytes()
    return np.ascontiguousarray(np.asarray(result)).tobytes()


def make_calls():
    """(name, call) pairs over shared inputs, built once."""
    rng = np.random.default_rng(29)
    x = (3 * rng.standard_normal((64, 4096))).astype(np.float32)
    x16 = x.astype(ml_dtypes.bfloat16)
    targets = (np.arange(64) * 977 % 4096).astype(np.int64)
    targets[3] = -100
    B, H, Hkv, L, S, E = 1, 4, 2, 96, 256, 64
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
    k_h, v_h = k.astype(np.float16), v.astype(np.float16)
    k_b, v_b = k.astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16)
    q_b = q.astype(ml_dtypes.bfloat16)
    k_i8, v_i8 = softdot.quantize_kv(k), softdot.quantize_kv(v)
    # A paged cache: 2 sequences of 300 and 77 tokens in pages of 16
    # (NHD), pages in a shuffled order; decode (one query row each).
    page, pages = 16, 40
    k_cache = rng.standard_normal((pages, page, Hkv, E)).astype(np.float32)
    v_cache = rng.standard_normal((pages, page, Hkv, E)).astype(np.float32)
    table = rng.permutation(pages)[:38].reshape(2, 19).astype(np.int32)
    seq_lens = np.array([300, 77], dtype=np.int32)
    q_dec = rng.standard_normal((2, H, 1, E)).astype(np.float32)
    hidden = rng.standard_normal((48, 64)).astype(np.float32)
    weight = (0.2 * rng.standard_normal((1000, 64))).astype(np.float32)
    lce_targets = (np.arange(48) * 131 % 1000).astype(np.int64)
    sdpa = softdot.scaled_dot_product_attention
    calls = [
        ("softmax", lambda: softdot.softmax(x)),
        ("log_softmax", lambda: softdot.log_softmax(x)),
        ("softmax_bf16", lambda: softdot.softmax(x16)),
        ("attention_f32", lambda: sdpa(q, k, v, causal=True, return_lse=True)),
        ("attention_f16", lambda: sdpa(q, k_h, v_h, causal=True, return_lse=True)),
        ("attention_bf16", lambda: sdpa(q, k_b, v_b, causal=True, return_lse=True)),
        ("attention_int8", lambda: sdpa(q, k_i8, v_i8, causal=True, return_lse=True)),
        ("attention_q_bf16", lambda: sdpa(q_b, k_b, v_b, causal=True, return_lse=True)),
        (
            "paged_attention",
            lambda: softdot.paged_attention(
                q_dec, k_cache, v_cache, table, seq_lens, return_lse=True
            ),
        ),
        ("cross_entropy", lambda: softdot.cross_entropy(x, targets, reduction="none", grad=True)),
        (
            "cross_entropy_bf16",
            lambda: softdot.cross_entropy(x16, targets, label_smoothing=0.1, grad=True),
        ),
        (
            "linear_cross_entropy",
            lambda: softdot.linear_cross_entropy(hidden, weight, lce_targets, grad=True),
        ),
    ]
    if torch is not None:
        tq, tk, tv = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
        calls.append(("attention_torch", lambda: sdpa(tq, tk, tv, causal=True)))
    return calls


def run(seconds: float, threads: int, warmup_passes: int, rss_limit_mib: float) -> dict:
    calls = make_calls()
    expected = [as_bytes(call()) for _, call in calls]
    counts = [[0] * len(calls) for _ in range(threads)]
    mismatches: list[str] = []
    errors: list[str] = []
    warm = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(t: int) -> None:
        passes = 0
        while not stop.is_set():
            for s in range(len(calls)):
                j = (s + t) % len(calls)
                name, call = calls[j]
                try:
                    got = as_bytes(call())
                except Exception as e:  # noqa: BLE001 (recorded and reported)
                    errors.append(f"{name}: {type(e).__name__}: {e}")
                    continue
                counts[t][j] += 1
                if got != expected[j]:
                    mismatches.append(f"{name} (thread {t}, pass {passes})")
            passes += 1
            if passes == warmup_passes:
                warm.wait()

    start = time.monotonic()
    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    warm.wait()
    warm_s = time.monotonic() - start
    rss_warm = rss_kib()
    calls_warm = sum(map(sum, counts))
    while time.monotonic() - start < seconds:
        time.sleep(0.05)
    stop.set()
    for th in pool:
        th.join()
    elapsed = time.monotonic() - start
    rss_end = rss_kib()
    total = sum(map(sum, counts))
    growth = (rss_end - rss_warm) / 1024.0
    ok = not mismatches and not errors and growth < rss_limit_mib
    return {
        "threads": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "simd_target": softdot.simd_target(),
        "seconds": round(elapsed, 1),
        "calls": total,
        "calls_after_warmup": total - calls_warm,
        "per_call": {name: sum(c[j] for c in counts) for j, (name, _) in enumerate(calls)},
        "mismatches": len(mismatches),
        "mismatch_examples": mismatches[:10],
        "errors": len(errors),
        "error_examples": errors[:10],
        "rss_warm_kib": rss_warm,
        "warm_at_s": round(warm_s, 1),
        "rss_end_kib": rss_end,
        "growth_mib": round(growth, 2),
        "rss_limit_mib": rss_limit_mib,
        "ok": ok,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--warmup-passes", type=int, default=2)
    p.add_argument("--rss-limit-mib", type=float, default=8.0)
    p.add_argument("--json", help="also write the record to this file")
    a = p.parse_args()
    r = run(a.seconds, a.threads, a.warmup_passes, a.rss_limit_mib)
    print("stress_threads: per call: " + " ".join(f"{k} {v}" for k, v in r["per_call"].items()))
    for m in r["mismatch_examples"] + r["error_examples"]:
        print(f"stress_threads: {m}", file=sys.stderr)
    print(
        f"stress_threads: threads={r['threads']} OMP_NUM_THREADS={r['omp_num_threads']} "
        f"target={r['simd_target']} seconds={r['seconds']} calls={r['calls']} "
        f"(after warm-up {r['calls_after_warmup']}) mismatches={r['mismatches']} "
        f"errors={r['errors']} rss_warm_kib={r['rss_warm_kib']} (at {r['warm_at_s']} s) "
        f"rss_end_kib={r['rss_end_kib']} growth_mib={r['growth_mib']} "
        f"rule=<{r['rss_limit_mib']} MiB -> {'OK' if r['ok'] else 'FAILED'}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
