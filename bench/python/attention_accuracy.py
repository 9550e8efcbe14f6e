"""Attention accuracy: softdot next to PyTorch (and ONNX Runtime, OpenVINO when
installed) on the same float32 inputs, against a float64 reference.

    python bench/python/attention_accuracy.py
    python bench/python/attention_accuracy.py --target AVX2   # AVX2 on an AVX-512 machine
    python bench/python/attention_accuracy.py --filter causal --impls softdot,torch --seeds 1

For each case and implementation it prints the largest error of an output
element in units of u W, u = 2^-24 and W_ic = sum_j w_ij |V_jc| (w the
float64 softmax of the float64 scores of the float32 inputs): the unit of
attention.h's bound, so a figure of 4 means 4 u W. Every implementation gets
the same float32 scale (1/sqrt(d) rounded to float), which the reference
uses too, so that the scale's own rounding is not counted against anyone.
Inputs: N(0, s) is normal with standard deviation s; Q, K, V are [1, 1, n, d].

Implementations:
  softdot          softdot.scaled_dot_product_attention (default);
  softdot precise  the same with precise=True (scores carried in double);
  torch matmul     matmul, * scale, (+ -inf causal mask), softmax, matmul in
                   float32 (ATen's math path written out: MKL sgemm);
  torch SDPA       torch.nn.functional.scaled_dot_product_attention in float32
                   (on CPU its flash-attention kernel);
  ORT matmul       ONNX Runtime, MatMul + Mul + (Add) + Softmax + MatMul (needs
                   the onnx package; --impls ...,ORT);
  OpenVINO         an opset13 ScaledDotProductAttention model, f32 precision.
--target AVX2 re-runs the script in a child whose environment limits ATen,
MKL, oneDNN (torch, OpenVINO) to AVX2 and forces softdot's AVX2 code.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

AVX2_ENV = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "SOFTDOT_ACCURACY_TARGET": "AVX2",
}

U = 2.0**-24

# name, n_q, n_kv, d, causal, inputs
CASES = [
    ("causal 1000x1000 d128 N(0,1)", 1000, 1000, 128, True, "normal"),
    ("512x2048 d64 N(0,1)", 512, 2048, 64, False, "normal"),
    ("256x8192 d128 N(0,3) (|s| to ~40)", 256, 8192, 128, False, "normal3"),
    ("512x2048 d64, V = 50 + N(0,1)", 512, 2048, 64, False, "offset"),
    ("512x2048 d128 U(-1,1)", 512, 2048, 128, False, "uniform"),
    ("causal 512x512 d64, Q K N(0,6) (|s| to ~100)", 512, 512, 64, True, "normal6"),
]


def inputs(kind, n_q, n_kv, d, seed):
    import numpy as np

    rng = np.random.default_rng(seed)

    def f(*shape, sd=1.0, loc=0.0):
        return (loc + sd * rng.standard_normal(shape)).astype(np.float32)

    if kind == "uniform":
        q, k, v = (rng.uniform(-1, 1, (1, 1, n, d)).astype(np.float32) for n in (n_q, n_kv, n_kv))
    elif kind == "normal3":
        q, k, v = f(1, 1, n_q, d, sd=3), f(1, 1, n_kv, d, sd=3), f(1, 1, n_kv, d, sd=3)
    elif kind == "normal6":
        q, k, v = f(1, 1, n_q, d, sd=6), f(1, 1, n_kv, d, sd=6), f(1, 1, n_kv, d)
    elif kind == "offset":
        q, k, v = f(1, 1, n_q, d), f(1, 1, n_kv, d), f(1, 1, n_kv, d, loc=50.0)
    else:
        q, k, v = f(1, 1, n_q, d), f(1, 1, n_kv, d), f(1, 1, n_kv, d)
    return q, k, v


def reference(q, k, v, scale, causal):
    """Exact-enough output and W in float64 (the scores' float64 rounding is
    about 2^-53 |s|, far below the float32 errors measured)."""
    import numpy as np

    q64, k64, v64 = (x[0, 0].astype(np.float64) for x in (q, k, v))
    s = (q64 @ k64.T) * scale
    if causal:
        n_q, n_kv = s.shape
        hide = np.arange(n_kv)[None, :] > (np.arange(n_q)[:, None] + n_kv - n_q)
        s[hide] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(axis=1, keepdims=True)
    return w @ v64, w @ np.abs(v64)


def run_softdot(q, k, v, scale, causal, precise=False):
    import softdot

    kw = {"precise": True} if precise else {}
    try:
        return softdot.scaled_dot_product_attention(q, k, v, causal=causal, scale=scale, **kw)
    except TypeError as e:
        raise NotImplementedError(f"no precise= ({e})") from e


def run_torch_matmul(q, k, v, scale, causal):
    import torch

    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with torch.no_grad():
        s = torch.matmul(tq, tk.transpose(-2, -1)).mul_(scale)
        if causal:
            n_q, n_kv = s.shape[-2:]
            hide = torch.ones(n_q, n_kv, dtype=torch.bool).triu_(n_kv - n_q + 1)
            s.masked_fill_(hide, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), tv).numpy()


def run_torch_sdpa(q, k, v, scale, causal):
    import torch
    import torch.nn.functional as F

    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with torch.no_grad():  # n_q == n_kv or not causal: top-left = bottom-right
        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=scale).numpy()


def run_ort_matmul(q, k, v, scale, causal):
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    n_q, n_kv, d = q.shape[2], k.shape[2], q.shape[3]
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
    ]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale")]
    last = "s1"
    if causal:
        hide = np.arange(n_kv)[None, :] > (np.arange(n_q)[:, None] + n_kv - n_q)
        inits.append(numpy_helper.from_array(np.where(hide, -np.inf, 0).astype(np.float32), "mask"))
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        last = "s2"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    g = helper.make_graph(
        nodes,
        "attention",
        [
            vi("q", TP.FLOAT, [1, 1, n_q, d]),
            vi("k", TP.FLOAT, [1, 1, n_kv, d]),
            vi("v", TP.FLOAT, [1, 1, n_kv, d]),
        ],
        [vi("o", TP.FLOAT, [1, 1, n_q, d])],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["o"], {"q": q, "k": k, "v": v})[0]


def run_openvino(q, k, v, scale, causal):
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    ps = [
        ops.parameter(list(x.shape), ov.Type.f32, name=n) for x, n in ((q, "q"), (k, "k"), (v, "v"))
    ]
    n_q, n_kv = q.shape[2], k.shape[2]
    hide = np.arange(n_kv)[None, :] > (np.arange(n_q)[:, None] + n_kv - n_q)
    mask = ops.constant(np.where(hide & causal, -np.inf, 0).astype(np.float32))
    o = ops.scaled_dot_product_attention(
        ps[0], ps[1], ps[2], mask, ops.constant(np.array(scale, np.float32))
    )
    cfg = {"INFERENCE_PRECISION_HINT": "f32"}
    compiled = ov.Core().compile_model(ov.Model([o], ps, "sdpa"), "CPU", cfg)
    return compiled({"q": q, "k": k, "v": v})[0].copy()


IMPLS = {
    "softdot": run_softdot,
    "softdot precise": lambda *a: run_softdot(*a, precise=True),
    "torch matmul": run_torch_matmul,
    "torch SDPA": run_torch_sdpa,
    "ORT matmul": run_ort_matmul,
    "OpenVINO": run_openvino,
}


def child(args) -> None:
    import numpy as np
    import torch
    from bench_softdot import cpu_model

    try:
        import softdot

        target = os.environ.get("SOFTDOT_ACCURACY_TARGET")
        if target:
            softdot.force_simd_target(target)
        sd = f"{softdot.simd_target()} ({os.path.dirname(softdot.__file__)})"
    except ImportError as e:
        sd = f"not importable ({e})"
    print(
        f"# CPU: {cpu_model()}; softdot {sd}; torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
    )
    seeds = [int(x) for x in args.seeds.split(",")]
    print(
        "# max |O - exact| / (u W) over all outputs and seeds, u = 2^-24, "
        f"W_ic = sum_j w_ij |V_jc|; seeds {args.seeds}"
    )
    names = [n for n in IMPLS if any(s in n for s in args.impls.split(","))]
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for name, n_q, n_kv, d, causal, kind in CASES:
        if args.filter and args.filter not in name:
            continue
        worst = {impl: 0.0 for impl in names}
        scale = float(np.float32(1.0 / math.sqrt(d)))
        for seed in seeds:
            q, k, v = inputs(kind, n_q, n_kv, d, seed)
            o, w = reference(q, k, v, scale, causal)
            for impl in names:
                if worst[impl] is None:
                    continue
                try:
                    got = np.asarray(IMPLS[impl](q, k, v, scale, causal), np.float64)[0, 0]
                    worst[impl] = max(worst[impl], float(np.max(np.abs(got - o) / (U * w))))
                except (ImportError, NotImplementedError) as e:
                    worst[impl] = None
                    print(f"# {impl}: {e}", file=sys.stderr)
        cells = ["n/a" if worst[i] is None else f"{worst[i]:.2f}" for i in names]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="", help="AVX2: force AVX2 in softdot, ATen, MKL, oneDNN")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument(
        "--impls",
        default="softdot,torch,OpenVINO",
        help="comma-separated name parts of the implementations to run",
    )
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds; the max is shown")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.target and os.environ.get("SOFTDOT_ACCURACY_TARGET") != args.target:
        if args.target != "AVX2":
            sys.exit("--target: only AVX2 is supported")
        env = dict(os.environ, **AVX2_ENV)
        argv = getattr(sys, "orig_argv", [sys.executable] + sys.argv)[1:]
        sys.exit(subprocess.call([sys.executable] + argv, env=env))
    child(args)


if __name__ == "__main__":
    main()
