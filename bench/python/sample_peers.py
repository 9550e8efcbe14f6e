"""softdot.sample against torch's sort-based top-k / top-p path and against
one softdot.softmax pass over the same rows.

    python bench/python/sample_peers.py [--threads 1 2] [--min-time 0.2]
        [--repetitions 3] [--vocab 131072 262144] [--batch 1 64]

The torch path is the one vLLM's torch fallback and Hugging Face take:
logits / T, torch.sort, the top-k threshold by gather, softmax + cumsum for
top-p, scatter back, softmax, and a draw by the exponential race
(probs / Exp(1), argmax), as vLLM does. softdot.softmax is timed on the same
rows with an output buffer (out=), the cost of one full pass over the row.
Rows are N(0, 2) logits, seeded. Each figure is the median of --repetitions
loops of at least --min-time seconds; torch and softdot run with the same
thread count (torch.set_num_threads and OMP_NUM_THREADS is not touched:
softdot's rows run on OpenMP threads, limited with threadpoolctl-free
os.environ before import, so run once per thread count: the script re-execs
itself per --threads value). Ratios within one run, printed per case:
torch_sort / softdot.sample (goal >= 3) and softdot.sample / softdot.softmax
(goal <= 1.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = [
    ("temperature 0.8", dict(temperature=0.8)),
    ("top_k 50", dict(temperature=0.8, top_k=50)),
    ("top_p 0.9", dict(temperature=0.8, top_p=0.9)),
    ("top_k 50 + top_p 0.9", dict(temperature=0.8, top_k=50, top_p=0.9)),
    ("min_p 0.05", dict(temperature=0.8, min_p=0.05)),
]


def timed(call, min_time: float, reps: int) -> float:
    out = []
    for _ in range(reps):
        n = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            dt = time.perf_counter() - t0
            if dt >= min_time:
                out.append(dt / n)
                break
            n *= 2
    return statistics.median(out)


def torch_sort_path(torch, logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    x = logits / temperature
    s, idx = x.sort(dim=-1, descending=False)
    if top_k:
        thr = s.gather(1, torch.full((s.shape[0], 1), s.shape[1] - top_k, dtype=torch.long))
        s.masked_fill_(s < thr, -float("inf"))
    if top_p < 1.0:
        cum = s.softmax(dim=-1).cumsum(dim=-1)
        mask = cum <= 1 - top_p
        mask[:, -1] = False
        s.masked_fill_(mask, -float("inf"))
    if min_p > 0.0:
        p = s.softmax(dim=-1)
        s.masked_fill_(p < min_p * p[:, -1:], -float("inf"))
    x = s.scatter(-1, idx, s)
    probs = x.softmax(dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def run(args) -> None:
    import numpy as np
    import torch

    import softdot

    torch.set_num_threads(args.threads[0])
    print(
        f"threads {args.threads[0]}, softdot SIMD target {softdot.simd_target()}, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'case':24s} {'B':>3s} {'V':>7s} {'sample us':>10s} {'torch_sort us':>14s} "
        f"{'softmax us':>11s} {'torch/sample':>13s} {'sample/softmax':>15s}"
    )
    rng = np.random.default_rng(1)
    for vocab in args.vocab:
        for batch in args.batch:
            x = (rng.standard_normal((batch, vocab)) * 2).astype(np.float32)
            xt = torch.from_numpy(x)
            y = np.empty_like(x)
            seeds = np.arange(batch, dtype=np.uint64)
            t_soft = timed(lambda: softdot.softmax(x, out=y), args.min_time, args.repetitions)
            for name, opts in CASES:
                t_s = timed(
                    lambda: softdot.sample(x, seed=seeds, **opts), args.min_time, args.repetitions
                )
                t_t = timed(lambda: torch_sort_path(torch, xt, **opts), args.min_time, 1)
                print(
                    f"{name:24s} {batch:3d} {vocab:7d} {t_s * 1e6:10.1f} {t_t * 1e6:14.1f} "
                    f"{t_soft * 1e6:11.1f} {t_t / t_s:13.2f} {t_s / t_soft:15.2f}"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--vocab", type=int, nargs="+", default=[131072, 262144])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args()
    if len(args.threads) == 1 and os.environ.get("OMP_NUM_THREADS") == str(args.threads[0]):
        run(args)
        return
    for t in args.threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(t))
        cmd = [sys.executable, __file__, "--threads", str(t)]
        cmd += ["--min-time", str(args.min_time), "--repetitions", str(args.repetitions)]
        cmd += ["--vocab", *map(str, args.vocab), "--batch", *map(str, args.batch)]
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
