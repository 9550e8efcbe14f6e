"""softdot.linear_cross_entropy(..., grad=True) against F.linear +
F.cross_entropy forward and backward (torch autograd) on the same float32
inputs: time (best of --reps in each of --rounds alternating processes),
peak memory beyond the inputs and gradients,
and the loss and gradient errors against a float64 reference.

    python bench/python/linear_cross_entropy_peers.py [--full] [--threads 1,2]
        [--shape N,D,V] [--reps 3] [--rounds 2] [--no-error] [--bf16]

Default shape N=1024, D=1024, V=32768 (--full: 4096, 4096, 131072, ~13
TFLOP a run). Every measurement runs in its own process (OMP_NUM_THREADS and
torch.set_num_threads at its thread count): peak memory is the peak RSS at the
end (VmHWM) minus the RSS once the inputs are made, torch imported, a small
call of each library done and the peak reset (/proc/self/clear_refs), less
the bytes of the two gradients (both sides return them). Errors: at the
same shape, float64 torch on the same float32 (or bfloat16-rounded)
inputs as the reference; the largest relative error of a row loss
(reduction="none"; ignored rows 0 on both sides), and for each gradient
the largest absolute error over the largest |reference|.
Ratios are softdot / torch (time, memory, error): below 1 favours softdot."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def make_inputs(n, d, v, bf16, torch):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) * (1.0 / d**0.5)
    t = torch.randint(0, v, (n,), generator=g)
    t[::17] = -100
    if bf16:
        h, w = h.bfloat16(), w.bfloat16()
    return h, w, t


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def worker(args) -> None:
    import torch
    import torch.nn.functional as F

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):  # e.g. AVX2 on an AVX-512 machine
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    torch.set_num_threads(args.threads)
    n, d, v = args.shape
    h, w, t = make_inputs(n, d, v, args.bf16, torch)
    # Warm both libraries on a small case so their one-time allocations are
    # in the baseline.
    hs, ws, ts = make_inputs(8, d, 64, args.bf16, torch)
    softdot.linear_cross_entropy(hs, ws, ts, grad=True)
    hh, wr = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    F.cross_entropy(F.linear(hh, wr), ts).backward()
    # Reset the peak (VmHWM) to the present RSS, so that transients of the
    # set-up do not count: Linux's clear_refs "5".
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_bytes("VmRSS")

    if args.side == "softdot":

        def run():
            return softdot.linear_cross_entropy(h, w, t, grad=True)

    else:

        def run():
            hr = h.detach().requires_grad_()
            wr = w.detach().requires_grad_()
            loss = F.cross_entropy(F.linear(hr, wr), t)
            loss.backward()
            return loss, hr.grad, wr.grad

    best = float("inf")
    out = None
    for _ in range(args.reps):
        out = None
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    peak = status_bytes("VmHWM")
    grads = (n * d + v * d) * out[1].element_size()
    result = {"time": best, "mem": max(0, peak - base - grads)}
    if args.error:
        loss, gh, gw = out
        torch.set_num_threads(os.cpu_count() or 1)
        h64 = h.double().requires_grad_()
        w64 = w.double().requires_grad_()
        ref = F.cross_entropy(F.linear(h64, w64), t)
        ref.backward()
        # Row losses (reduction="none"): the mean's float32 rounding would
        # hide the rows' errors.
        if args.side == "softdot":
            rows = softdot.linear_cross_entropy(h, w, t, reduction="none")
        else:
            with torch.no_grad():
                rows = F.cross_entropy(F.linear(h, w), t, reduction="none")
        with torch.no_grad():
            ref_rows = F.cross_entropy(F.linear(h64, w64), t, reduction="none")
        result["err"] = [
            ((rows.double() - ref_rows).abs() / ref_rows.abs().clamp_min(1e-300)).max().item(),
            ((gh.double() - h64.grad).abs().max() / h64.grad.abs().max()).item(),
            ((gw.double() - w64.grad).abs().max() / w64.grad.abs().max()).item(),
        ]
    print(json.dumps(result))


def spawn(side, threads, args, error):
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        side,
        "--threads",
        str(threads),
        "--shape",
        ",".join(map(str, args.shape)),
        "--reps",
        str(args.reps),
    ]
    if error:
        cmd.append("--error")
    if args.bf16:
        cmd.append("--bf16")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--full", action="store_true")
    p.add_argument("--shape", type=lambda s: tuple(int(x) for x in s.split(",")))
    p.add_argument("--threads", default=f"1,{os.cpu_count()}")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-error", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--worker", choices=["softdot", "torch"])
    p.add_argument("--error", action="store_true")
    args = p.parse_args()
    if args.shape is None:
        args.shape = (4096, 4096, 131072) if args.full else (1024, 1024, 32768)
    if args.worker:
        args.side = args.worker
        args.threads = int(args.threads)
        worker(args)
        return
    import torch

    import softdot

    if os.environ.get("SOFTDOT_BENCH_TARGET"):
        softdot.force_simd_target(os.environ["SOFTDOT_BENCH_TARGET"])
    n, d, v = args.shape
    print(
        f"linear_cross_entropy N={n} D={d} V={v} {'bfloat16' if args.bf16 else 'float32'}; "
        f"softdot {softdot.simd_target()}, torch {torch.__version__}; "
        f"best of {args.reps} x {args.rounds} rounds"
    )
    threads = [int(x) for x in args.threads.split(",")]
    for i, th in enumerate(threads):
        error = not args.no_error and i == 0
        s = spawn("softdot", th, args, error)
        r = spawn("torch", th, args, error)
        # Alternate the sides --rounds times in all and keep each one's best
        # time: on a shared machine the load changes between processes.
        for _ in range(args.rounds - 1):
            s["time"] = min(s["time"], spawn("softdot", th, args, False)["time"])
            r["time"] = min(r["time"], spawn("torch", th, args, False)["time"])
        print(
            f"threads {th}: time softdot {s['time']:.3f} s torch {r['time']:.3f} s "
            f"ratio {s['time'] / r['time']:.2f}; peak beyond inputs+grads softdot "
            f"{s['mem'] / 2**20:.1f} MiB torch {r['mem'] / 2**20:.1f} MiB "
            f"ratio {s['mem'] / max(r['mem'], 1):.3f}"
        )
        if error:
            names = ("row loss", "grad_hidden", "grad_weight")
            for k, name in enumerate(names):
                se, te = s["err"][k], r["err"][k]
                print(
                    f"  error vs float64 {name:12s} softdot {se:.2e} torch {te:.2e} "
                    f"ratio {se / te if te else float('nan'):.2f}"
                )


if __name__ == "__main__":
    main()
