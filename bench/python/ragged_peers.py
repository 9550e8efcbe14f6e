"""A mixed serving batch, as a server sees it, side by side with what a Python user can
build from the peers on the same paged cache (issue 26's speed goal).

The batch: 4 prefill chunks of 512 rows on cached prefixes of 2k, 4k, 6k and 8k tokens,
and 12 decode rows on contexts of 4k to 32k; 32 query heads on 8 KV heads, d = 128; pages
of 16 tokens in vLLM's layout, taken in a random order; bfloat16 or int8 pages.

- softdot: one ``paged_attention`` call over the ragged batch (``query_start_loc``),
  bfloat16 query and output (int8 pages: float32 query and output, as
  ``paged_attention`` takes int8 caches).
- torch SDPA: per sequence, its pages gathered (``index_select``) and
  ``scaled_dot_product_attention`` with ``enable_gqa`` (bfloat16; int8 pages
  dequantised to bfloat16 first, torch has no int8 attention), a bottom-right causal
  mask for the prefill chunks.

softdot runs twice: by default and with ``batch_invariant=True`` (every row in the decode
form: a token's bits do not depend on its batch). It also times the 12 decode rows alone
(softdot, both ways) and reports their K+V bytes per second against a read roofline
(torch.sum over a 1 GiB float32 array). OpenVINO's PagedAttention is not built here: Python
reaches it only through the private, experimental ``openvino._pyopenvino.op.
_PagedAttentionExtension``, whose inputs change between releases. Run:

    python bench/python/ragged_peers.py --threads 1,2 [--dtype bf16,int8] [--json F]

(SOFTDOT_BENCH_TARGET=AVX2 measures softdot's AVX2 code on an AVX-512 machine.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_softdot import best_time, cpu_model  # noqa: E402  (beside this script)

PAGE = 16
HQ, HKV, D = 32, 8, 128
PREFIX = [2048, 4096, 6144, 8192]
CHUNK = 512
DECODE = [4096 + i * (32768 - 4096) // 11 for i in range(12)]


def read_roofline(min_time: float) -> float:
    """Bytes per second of torch.sum over a 1 GiB float32 array."""
    import torch

    arena = torch.ones(2**28, dtype=torch.float32)
    return arena.numel() * 4 / best_time(lambda: arena.sum(), min_time, 3)


def build(dtype: str, rng):
    """The cache, table, lengths and the packed query of the mixed batch."""
    import ml_dtypes

    import softdot

    lens = [p + CHUNK for p in PREFIX] + DECODE
    nqs = [CHUNK] * len(PREFIX) + [1] * len(DECODE)
    blocks = [(n + PAGE - 1) // PAGE for n in lens]
    P = sum(blocks)
    order = rng.permutation(P).astype(np.int32)
    table = np.full((len(lens), max(blocks)), -1, np.int32)
    nxt = 0
    for b, k in enumerate(blocks):
        table[b, :k] = order[nxt : nxt + k]
        nxt += k
    shape = (P, PAGE, HKV, D)
    if dtype == "bf16":
        kc = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
        vc = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
    else:
        kc = softdot.quantize_kv(rng.standard_normal(shape, dtype=np.float32))
        vc = softdot.quantize_kv(rng.standard_normal(shape, dtype=np.float32))
        kc = (kc[0], kc[1][..., 0])
        vc = (vc[0], vc[1][..., 0])
    qsl = np.concatenate([[0], np.cumsum(nqs)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), HQ, D), dtype=np.float32)
    if dtype == "bf16":
        q = q.astype(ml_dtypes.bfloat16)
    return kc, vc, table, np.array(lens, np.int32), q, qsl, nqs


def kv_bytes(lens, dtype: str) -> int:
    per = HKV * D * (2 if dtype == "bf16" else 1) + (HKV * 4 if dtype == "int8" else 0)
    return 2 * per * int(sum(lens))


def run(threads: int, dtypes, min_time: float) -> dict:
    import torch
    import torch.nn.functional as F

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # e.g. AVX2 on an AVX-512 machine
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    rng = np.random.default_rng(26)
    roof = read_roofline(min_time)
    out = {"threads": threads, "roofline_GBs": roof / 1e9, "cases": []}
    for dtype in dtypes:
        kc, vc, table, lens, q, qsl, nqs = build(dtype, rng)
        B = len(lens)

        def sd(inv=False):
            return softdot.paged_attention(
                q, kc, vc, table, lens, causal=True, query_start_loc=qsl, batch_invariant=inv
            )

        t_sd = best_time(sd, min_time, 3)
        t_inv = best_time(lambda: sd(True), min_time, 3)
        # Decode rows alone (the last 12 sequences).
        nd = len(DECODE)
        qd = q[int(qsl[B - nd]) :]
        qsl_d = (qsl[B - nd :] - qsl[B - nd]).astype(np.int32)

        def sd_dec(inv=False):
            return softdot.paged_attention(
                qd,
                kc,
                vc,
                table[B - nd :],
                lens[B - nd :],
                causal=True,
                query_start_loc=qsl_d,
                batch_invariant=inv,
            )

        t_dec = best_time(sd_dec, min_time)
        t_dec_inv = best_time(lambda: sd_dec(True), min_time)
        dec_bytes = kv_bytes(DECODE, dtype)

        # torch: per sequence, gathered pages and SDPA.
        if dtype == "bf16":
            kt = torch.from_numpy(kc.view(np.uint16)).view(torch.bfloat16)
            vt = torch.from_numpy(vc.view(np.uint16)).view(torch.bfloat16)
            ks = vs = None
        else:
            kt, vt = torch.from_numpy(kc[0]), torch.from_numpy(vc[0])
            ks, vs = torch.from_numpy(kc[1]), torch.from_numpy(vc[1])
        qt = torch.from_numpy(np.asarray(q, np.float32)).to(torch.bfloat16)
        tab = torch.from_numpy(table).long()
        masks = {}
        for b in range(B):
            L, S = nqs[b], int(lens[b])
            if L > 1:
                masks[b] = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)

        def torch_peer():
            outs = []
            for b in range(B):
                n = int(lens[b])
                pages = tab[b, : (n + PAGE - 1) // PAGE]
                k = kt.index_select(0, pages).reshape(-1, HKV, D)[:n]
                v = vt.index_select(0, pages).reshape(-1, HKV, D)[:n]
                if ks is not None:
                    s_k = ks.index_select(0, pages).reshape(-1, HKV)[:n]
                    s_v = vs.index_select(0, pages).reshape(-1, HKV)[:n]
                    k = (k.float() * s_k[..., None]).to(torch.bfloat16)
                    v = (v.float() * s_v[..., None]).to(torch.bfloat16)
                r0, r1 = int(qsl[b]), int(qsl[b + 1])
                qb = qt[r0:r1].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(
                    qb,
                    k.transpose(0, 1)[None],
                    v.transpose(0, 1)[None],
                    attn_mask=masks.get(b),
                    enable_gqa=True,
                )
                outs.append(o)
            return outs

        with torch.no_grad():
            t_torch = best_time(torch_peer, min_time, 3)
        out["cases"].append(
            {
                "dtype": dtype,
                "softdot_ms": t_sd * 1e3,
                "torch_ms": t_torch * 1e3,
                "speedup": t_torch / t_sd,
                "decode_ms": t_dec * 1e3,
                "decode_GBs": dec_bytes / t_dec / 1e9,
                "decode_of_roofline": dec_bytes / t_dec / roof,
                "invariant_ms": t_inv * 1e3,
                "invariant_speedup": t_torch / t_inv,
                "invariant_decode_of_roofline": dec_bytes / t_dec_inv / roof,
            }
        )
        print(f"[{threads} thread(s)] {dtype}: {out['cases'][-1]}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtype", default="bf16,int8")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--json")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    dtypes = args.dtype.split(",")
    if args.child:
        print(json.dumps(run(args.child, dtypes, args.min_time)))
        return
    import subprocess

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # the target the children run
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    runs = []
    for th in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ, OMP_NUM_THREADS=str(th))
        cmd = [sys.executable, __file__, "--child", str(th), "--dtype", args.dtype]
        cmd += ["--min-time", str(args.min_time)]
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        sys.stderr.write(res.stderr)
        runs.append(json.loads(res.stdout))
    print(
        f"CPU: {cpu_model()}; softdot SIMD target "
        f"{softdot.simd_target()}, unit {softdot.matrix_unit()}"
    )
    print(
        f"Batch: 4 prefill chunks of {CHUNK} rows on prefixes {PREFIX}, 12 decode rows on "
        f"{DECODE[0]}..{DECODE[-1]}; {HQ} query heads on {HKV} KV heads, d = {D}, "
        f"pages of {PAGE}\n"
    )
    print(
        "| threads | pages | softdot ms | torch SDPA per sequence ms | speed-up | "
        "decode rows alone ms | decode GB/s | of read roofline | batch_invariant ms | "
        "its speed-up | its decode of roofline |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        for c in r["cases"]:
            print(
                f"| {r['threads']} | {c['dtype']} | {c['softdot_ms']:.1f} | {c['torch_ms']:.1f} | "
                f"{c['speedup']:.2f} | {c['decode_ms']:.2f} | {c['decode_GBs']:.1f} | "
                f"{c['decode_of_roofline']:.2f} | {c['invariant_ms']:.1f} | "
                f"{c['invariant_speedup']:.2f} | {c['invariant_decode_of_roofline']:.2f} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
