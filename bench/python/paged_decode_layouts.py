"""Decode rows over a paged cache, by page layout: the 12 decode rows of
ragged_peers.py (contexts of 4k to 32k, 32 query heads on 8 KV heads, d = 128) over
pages in vLLM's NHD layout and in HND, pages in a random or in sequential order, and
the same rows with contiguous keys (one call per sequence), also with NHD's strides
without pages; K+V bytes per second.
Prints one line per case. Run:

    OMP_NUM_THREADS=1 python bench/python/paged_decode_layouts.py \
        [--dtype bf16|f32|int8] [--query f32|bf16]

A bfloat16 query over bfloat16 pages (what engines pass) runs the decode form on the
bfloat16 units where the CPU has them (softdot.matrix_unit()); a float32 query the float
path. The read roofline of the same run (torch.sum over 1 GiB of float32 with the same
thread count) is printed first, and each case's fraction of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_softdot import cpu_model  # noqa: E402  (beside this script)

HQ, HKV, D = 32, 8, 128
DECODE = [4096 + i * (32768 - 4096) // 11 for i in range(12)]


def best(f, n: int = 5) -> float:
    f()
    t = 1e9
    for _ in range(n):
        a = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - a)
    return t


def roofline() -> float:
    """Bytes per second of torch.sum over 1 GiB of float32 (the thread count of torch's own
    setting, which follows OMP_NUM_THREADS)."""
    import torch

    x = torch.ones(1 << 28, dtype=torch.float32)
    return x.numel() * 4 / best(lambda: torch.sum(x), 5)


def cache(rng, shape, dtype: str):
    import ml_dtypes

    import softdot

    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype == "int8":
        vals, sc = softdot.quantize_kv(x.reshape(-1, shape[-1]))
        return vals.reshape(shape), sc.reshape(shape[:-1] + (1,))
    return x.astype(ml_dtypes.bfloat16) if dtype == "bf16" else x


def main() -> None:
    import softdot

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32", "int8"])
    ap.add_argument(
        "--query",
        default=None,
        choices=["f32", "bf16"],
        help="query format (default: bf16 for bf16 pages, else f32)",
    )
    args = ap.parse_args()
    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # e.g. AVX2 on an AVX-512 machine
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    per = {"bf16": 2 * D, "f32": 4 * D, "int8": D + 4}[args.dtype]
    nbytes = 2 * sum(DECODE) * HKV * per
    rng = np.random.default_rng(1)
    q = rng.standard_normal((12, HQ, D), dtype=np.float32)
    query = args.query or ("bf16" if args.dtype == "bf16" else "f32")
    if query == "bf16":
        import ml_dtypes

        q = q.astype(ml_dtypes.bfloat16)
    roof = roofline()
    qsl = np.arange(13, dtype=np.int32)
    lens = np.array(DECODE, np.int32)
    print(
        f"CPU: {cpu_model()}; SIMD target {softdot.simd_target()}; {args.dtype} pages, "
        f"{query} query; matrix unit {softdot.matrix_unit()}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
        f"read roofline (torch.sum) {roof / 1e9:.1f} GB/s"
    )
    for layout, page, order in [
        ("NHD", 16, "random"),
        ("NHD", 16, "sequential"),
        ("HND", 16, "random"),
        ("HND", 16, "sequential"),
        ("NHD", 256, "random"),
        ("HND", 256, "random"),
    ]:
        blocks = [(n + page - 1) // page for n in DECODE]
        P = sum(blocks)
        perm = rng.permutation(P) if order == "random" else np.arange(P)
        table = np.full((12, max(blocks)), -1, np.int32)
        nxt = 0
        for b, nb in enumerate(blocks):
            table[b, :nb] = perm[nxt : nxt + nb]
            nxt += nb
        shape = (P, page, HKV, D) if layout == "NHD" else (P, HKV, page, D)
        kc, vc = cache(rng, shape, args.dtype), cache(rng, shape, args.dtype)
        t = best(
            lambda: softdot.paged_attention(
                q, kc, vc, table, lens, causal=True, query_start_loc=qsl, kv_layout=layout
            )
        )
        print(
            f"{layout} pages of {page}, {order} order: {t * 1e3:.1f} ms, "
            f"{nbytes / t / 1e9:.1f} GB/s, {nbytes / t / roof:.2f} of roofline"
        )
    ks = [cache(rng, (1, HKV, n, D), args.dtype) for n in DECODE]
    vs = [cache(rng, (1, HKV, n, D), args.dtype) for n in DECODE]
    q1 = q[:1, :, None]

    def contiguous() -> None:
        for k, v in zip(ks, vs):
            softdot.scaled_dot_product_attention(q1, k, v, causal=True)

    t = best(contiguous)
    print(
        f"contiguous, one call per sequence: {t * 1e3:.1f} ms, {nbytes / t / 1e9:.1f} GB/s, "
        f"{nbytes / t / roof:.2f} of roofline"
    )
    # The same keys with NHD's strides and no pages: [n, H_kv, d] seen as [1, H_kv, n, d].
    ns = [np.ascontiguousarray(k[0].transpose(1, 0, 2)) for k in ks]
    nv = [np.ascontiguousarray(v[0].transpose(1, 0, 2)) for v in vs]
    if args.dtype == "int8":
        print("contiguous with NHD strides: not measured for int8 (its scales need their own view)")
        return

    def strided() -> None:
        for k, v in zip(ns, nv):
            softdot.scaled_dot_product_attention(
                q1, k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None], causal=True
            )

    t = best(strided)
    print(
        f"contiguous with NHD strides: {t * 1e3:.1f} ms, {nbytes / t / 1e9:.1f} GB/s, "
        f"{nbytes / t / roof:.2f} of roofline"
    )


if __name__ == "__main__":
    main()
