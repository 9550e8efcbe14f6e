"""Attention decode and prefill: softdot next to PyTorch, ONNX Runtime and
OpenVINO, side by side in one process per thread count. (Over 600 lines on
purpose: each peer's adapter sits beside the others so that all of them run
the same cases on the same arrays.)

    python bench/python/attention_peers.py --threads 1,2 --json peers.json --svg peers.svg
    python bench/python/attention_peers.py --threads 1 --quick --filter 'decode f32 B1'
    python bench/python/attention_peers.py --target AVX2      # AVX2 on an AVX-512 machine

Implementations (all on the same arrays, one after another for each case):
  softdot        softdot.scaled_dot_product_attention (Q float32; K, V float32,
                 float16, bfloat16, or int8 as (values, scales) pairs from
                 softdot.quantize_kv; output float32; in the 16-bit prefill
                 cases Q, K, V and the output all 16-bit, as torch's, the
                 products on the unit softdot.matrix_unit() names, P rounded
                 once to bfloat16);
  softdot split  16-bit prefill only: unit_weights="split" (P as two
                 bfloat16 parts) with a float32 output (its error would
                 otherwise be the output's rounding);
  torch SDPA     torch.nn.functional.scaled_dot_product_attention, enable_gqa=True
                 when the heads differ (torch needs one dtype: Q, K, V and the
                 output are all 16-bit in the 16-bit cases);
  torch matmul   matmul + softmax + matmul written out (the math path), GQA as
                 Q [B, Hkv, G*L, E] against K [B, Hkv, S, E] (no copy of K, V);
  ONNX Runtime   a one-node model built with the onnx helper API: decode with
                 com.microsoft GroupQueryAttention, K/V as its past_key/value
                 buffers shared with present_key/value (IOBinding; the call
                 writes the last n_q keys, which it is given, in place);
                 prefill with MultiHeadAttention (non-causal) or
                 GroupQueryAttention (causal); MatMul+Softmax+MatMul where the
                 contrib op does not load (the table's note says which ran).
                 The models name ai.onnx opset 17 and the oldest IR version it
                 needs (8), not the installed onnx's newest, so an older
                 onnxruntime loads them too (e.g. onnx 1.23 writes IR 14,
                 onnxruntime 1.30 reads up to 13);
  OpenVINO       an opset13 ScaledDotProductAttention model (16-bit K/V through
                 a Convert to f32), compiled for CPU with INFERENCE_NUM_THREADS
                 and INFERENCE_PRECISION_HINT=f32 (no silent bf16); GQA as for
                 torch matmul. In the 16-bit prefill cases the hint is the
                 cases' dtype (bf16 or f16), as its users run it, with the
                 query rounded to that dtype.
16-bit prefill accuracy ("err/(u W)"): on 48 rows spread over the heads and
positions, max_c |O - exact| / (u W_c), the exact result computed in float64
from the 16-bit inputs, W_c = sum_j w_j |V_jc|, u = 2^-8 (bfloat16) or
2^-11 (float16): the measure of the issue's goals (torch: 6e-4 to 8e-3
absolute).
onnx + onnxruntime and openvino are optional: one not installed is a "not
run" line under the table, saying so.
int8 decode (K, V quantised by softdot.quantize_kv: int8 values and one float32
scale per row; the bytes counted are the values plus the scales): no peer here
reads int8 K and V inside its attention kernel from Python. torch SDPA runs on
the dequantised float32 K and V (scale * value), a reference point labelled as
such (its K+V GB/s divides the int8 bytes by its time, so it compares as times
do; it reads about 3.9x as many bytes); OpenVINO takes the int8 values and the
scales as inputs and dequantises them (Convert, Multiply) in front of its
SDPA: its CPU plugin's own u8 KV cache (KV_CACHE_PRECISION) is the internal
state of a stateful model, which a model taking K and V as inputs cannot
use; torch matmul is not run on int8, nor ONNX Runtime: its GroupQueryAttention
takes an int8 cache (k_quant_type) only with one scale per tensor or per
channel, another format than quantize_kv's one scale per token. The torch row
is named "torch SDPA (dequantised f32)" in the table.
Decode is causal bottom-right (the n_q new tokens are the last positions; for
n_q = 1 that is no mask). K and V come from memory: each call reads the next
of several copies of K and V filling an arena of at least 2 x the last-level
cache (lscpu) and 2 copies. Roofline: the read bandwidth of torch.sum and of
numpy's add.reduce (one chunk per thread, in Python threads) over that arena,
the better of the two. Prefill has no FMA peak here (no cheap loop for one
from Python): its column is the fraction of MKL sgemm's rate (torch.mm,
1024^3 float32, same threads), labelled as such.

Each figure is the best of 5 loops of >= 0.1 s (2 loops of one call when a
call takes over a second). Every implementation's output is compared with
softdot's on the same inputs (max |difference|). A thread count runs in a
child process: OMP_NUM_THREADS (softdot's OpenMP, set before import),
torch.set_num_threads, ORT intra_op_num_threads, OpenVINO
INFERENCE_NUM_THREADS. --target AVX2 (or SOFTDOT_BENCH_TARGET) forces
softdot's AVX2 code and limits torch (ATen, MKL, oneDNN), OpenVINO (its
oneDNN-based JIT kernels: the note shows jit_avx2) and numpy to AVX2 through
their environment variables; ONNX Runtime's MLAS has no such switch and keeps
AVX-512.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

from attention_peers_report import decode_chart, report
from bench_softdot import cpu_model
from report_writer import write_json, write_svg

AVX2_ENV = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL "
    "AVX512_ICL AVX512_SPR",
}
IMPLS = ["softdot", "softdot split", "torch SDPA", "torch matmul", "ONNX Runtime", "OpenVINO"]
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "int8": 1}


def kv_bytes(c) -> int:
    """Bytes of K and V of case c (int8: the values and the float32 scales)."""
    rows = c["B"] * c["Hkv"] * c["S"]
    return 2 * rows * (c["E"] * ITEMSIZE[c["dtype"]] + (4 if c["dtype"] == "int8" else 0))


class Skip(Exception):
    """An implementation that does not run a case; the message says why."""


def l3_bytes() -> int:
    """Total last-level cache: lscpu's ALL-SIZE of the highest level, else sysfs."""
    try:
        out = subprocess.run(
            ["lscpu", "--caches=LEVEL,ALL-SIZE", "--bytes"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = [tuple(int(x) for x in line.split()) for line in out.splitlines()[1:]]
        return max(rows)[1]
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    caches = {}  # (level, shared cpus) -> bytes
    root = "/sys/devices/system/cpu"
    for cpu in os.listdir(root):
        d = os.path.join(root, cpu, "cache")
        for idx in os.listdir(d) if re.fullmatch(r"cpu\d+", cpu) and os.path.isdir(d) else []:
            try:
                with open(os.path.join(d, idx, "level")) as f:
                    level = int(f.read())
                with open(os.path.join(d, idx, "size")) as f:
                    size = int(f.read().strip().rstrip("K")) << 10
                with open(os.path.join(d, idx, "shared_cpu_list")) as f:
                    caches[(level, f.read().strip())] = size
            except (OSError, ValueError):
                continue
    top = max((lv for lv, _ in caches), default=None)
    return sum(v for (lv, _), v in caches.items() if lv == top) if top else 256 << 20


def cases(quick: bool) -> list:
    out = []
    for dt in ("f32", "bf16", "f16", "int8"):
        for hq, hkv in ((32, 8), (8, 2)):
            for b in (1, 8):
                for nq in (1, 4):
                    for s in (4096, 32768) + (() if quick else (131072,)):
                        out.append(
                            {
                                "kind": "decode",
                                "dtype": dt,
                                "B": b,
                                "Hq": hq,
                                "Hkv": hkv,
                                "L": nq,
                                "S": s,
                                "E": 128,
                                "causal": True,
                            }
                        )
    for dt in ("f32", "bf16", "f16"):
        for n in (1024, 4096) + (() if quick else (16384,)):
            for e in (64, 128):
                for causal in (False, True):
                    out.append(
                        {
                            "kind": "prefill",
                            "dtype": dt,
                            "B": 1,
                            "Hq": 8,
                            "Hkv": 8,
                            "L": n,
                            "S": n,
                            "E": e,
                            "causal": causal,
                        }
                    )
    for c in out:
        if c["kind"] == "decode":
            c["label"] = (
                f"decode {c['dtype']} B{c['B']} H{c['Hq']}/{c['Hkv']} nq{c['L']} "
                f"nkv{c['S']} d{c['E']}"
            )
        else:
            c["label"] = (
                f"prefill {c['dtype']} {'causal' if c['causal'] else 'full'} "
                f"n{c['L']} d{c['E']} H{c['Hq']}"
            )
    return out


def best_time(f, min_time: float, repeats: int = 5) -> float:
    """Seconds per call of f(i), i the call's index (rotating buffers): the
    best of `repeats` loops of >= min_time; 2 loops for calls over 1 s."""
    i = 0
    t0 = time.perf_counter()
    f(i)
    i += 1
    first = time.perf_counter() - t0
    if first < min_time / 4:  # calibrate on warm calls
        n = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                f(i)
                i += 1
            first = (time.perf_counter() - t0) / n
            if first * n >= min_time / 4:
                break
            n *= 4
    n = max(1, math.ceil(min_time / max(first, 1e-9)))
    if first > 1.0:
        repeats = 2
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            f(i)
            i += 1
        best = min(best, (time.perf_counter() - t0) / n)
    return best


# ---- inputs ----------------------------------------------------------------
class Arenas:
    """One array per K/V dtype of `nbytes` bytes of N(0, 1) values (bfloat16
    kept as its uint16 bits), carved into copies of K and V per case."""

    def __init__(self, nbytes: int, seed: int = 1):
        self.nbytes, self.seed, self.data = nbytes, seed, {}

    def get(self, dt):
        import numpy as np

        if dt == "int8":
            return self.get_int8()
        if dt not in self.data:
            store = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dt]
            a = np.empty(self.nbytes // ITEMSIZE[dt], store)
            rng = np.random.default_rng(self.seed)
            step = 1 << 24
            for s in range(0, a.size, step):
                x = rng.standard_normal(min(step, a.size - s), dtype=np.float32)
                if dt == "bf16":  # round to nearest even, as the bits
                    u = x.view(np.uint32)
                    x = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
                a[s : s + x.size] = x
            self.data[dt] = a
        return self.data[dt]

    def get_int8(self, e: int = 128):
        """(values, scales): int8 [rows, e] and float32 [rows, 1] from
        softdot.quantize_kv of N(0, 1) rows, rows = nbytes // (e + 4)."""
        import numpy as np

        import softdot

        if "int8" not in self.data:
            rows = self.nbytes // (e + 4)
            values = np.empty((rows, e), np.int8)
            scales = np.empty((rows, 1), np.float32)
            rng = np.random.default_rng(self.seed)
            step = (1 << 24) // e
            for r in range(0, rows, step):
                x = rng.standard_normal((min(step, rows - r), e), dtype=np.float32)
                softdot.quantize_kv(x, out=(values[r : r + x.shape[0]], scales[r : r + x.shape[0]]))
            self.data["int8"] = (values, scales)
        return self.data["int8"]

    def kv(self, c):
        """[(K, V)] copies for case c, as many as fit (at least 2); int8: K
        and V are (values, scales) pairs."""
        shape = (c["B"], c["Hkv"], c["S"], c["E"])
        if c["dtype"] == "int8":
            values, scales = self.get_int8(c["E"])
            n = c["B"] * c["Hkv"] * c["S"]
            copies = max(1, values.shape[0] // (2 * n))
            pair = [
                (
                    values[j * n : (j + 1) * n].reshape(shape),
                    scales[j * n : (j + 1) * n].reshape(shape[:3] + (1,)),
                )
                for j in range(2 * copies)
            ]
            return [(pair[2 * j], pair[2 * j + 1]) for j in range(copies)]
        a = self.get(c["dtype"])
        n = c["B"] * c["Hkv"] * c["S"] * c["E"]
        copies = max(1, a.size // (2 * n))
        return [
            (
                a[2 * j * n : (2 * j + 1) * n].reshape(shape),
                a[(2 * j + 1) * n : (2 * j + 2) * n].reshape(shape),
            )
            for j in range(copies)
        ]


def as_torch(a, dt):
    import torch

    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if dt == "bf16" else t


def causal_mask(c, rows_per_query=1):
    """Bool [G*L, S]: query row r (of L, repeated G times) sees keys <= r + S - L."""
    import numpy as np

    L, S = c["L"], c["S"]
    m = np.arange(S)[None, :] <= (np.arange(L)[:, None] + S - L)
    return np.tile(m, (rows_per_query, 1))


# ---- implementations: each returns (f(i), output as float32 [B, Hq, L, E], note)
def q16(c, q):
    """The query rounded to the case's 16-bit dtype (16-bit prefill cases),
    as a numpy array of that dtype (ml_dtypes.bfloat16 for bf16), and as float32."""
    import ml_dtypes
    import numpy as np

    t = ml_dtypes.bfloat16 if c["dtype"] == "bf16" else np.float16
    a = q.astype(t)
    return a, a.astype(np.float32)


def sixteen_bit_prefill(c) -> bool:
    return c["kind"] == "prefill" and c["dtype"] in ("bf16", "f16")


def run_softdot(c, q, kv, env, split=False):
    import numpy as np

    import softdot

    if c["dtype"] == "bf16":
        import ml_dtypes

        kv = [(k.view(ml_dtypes.bfloat16), v.view(ml_dtypes.bfloat16)) for k, v in kv]
    causal = c["causal"] and not (c["kind"] == "decode" and c["L"] == 1)
    opts = {}
    note = ""
    if sixteen_bit_prefill(c):
        q, _ = q16(c, q)
        out = np.empty(q.shape, np.float32 if split else q.dtype)
        if split:
            opts["unit_weights"] = "split"
        note = f"Q, K, V 16-bit, out {out.dtype}; unit {softdot.matrix_unit()}"
        if c["dtype"] == "f16":
            note += " (float16: the float32 FMA path)"
    elif split:
        raise Skip("16-bit prefill only")
    else:
        out = np.empty(q.shape, np.float32)

    def f(i):
        k, v = kv[i % len(kv)]
        softdot.scaled_dot_product_attention(q, k, v, causal=causal, out=out, **opts)

    return f, lambda: out.astype(np.float32), note


def run_softdot_split(c, q, kv, env):
    return run_softdot(c, q, kv, env, split=True)


def accuracy(c, q, kv, out, rows=48):
    """max over sampled rows and columns of |O - exact| / (u W) (16-bit
    prefill cases): exact in float64 from the 16-bit inputs."""
    import numpy as np

    _, qf = q16(c, q)
    k, v = kv[0]
    if c["dtype"] == "bf16":
        k = (k.astype(np.uint32) << 16).view(np.float32)
        v = (v.astype(np.uint32) << 16).view(np.float32)
    k, v = k.astype(np.float64), v.astype(np.float64)
    u = 2.0**-8 if c["dtype"] == "bf16" else 2.0**-11
    G = c["Hq"] // c["Hkv"]
    scale = 1.0 / math.sqrt(c["E"])
    worst = 0.0
    rng = np.random.default_rng(5)
    for t in range(rows):
        h = int(rng.integers(c["Hq"]))
        i = int(rng.integers(c["L"])) if t % 4 else c["L"] - 1 - t // 4
        i = max(i, 0)
        hk = h // G
        vis = i + 1 if c["causal"] else c["S"]
        s = (k[0, hk, :vis] @ qf[0, h, i].astype(np.float64)) * scale
        w = np.exp(s - s.max())
        w /= w.sum()
        exact = w @ v[0, hk, :vis]
        W = w @ np.abs(v[0, hk, :vis])
        err = np.abs(out[0, h, i].astype(np.float64) - exact) / (u * W)
        worst = max(worst, float(err.max()))
    return worst


def dequantised(c, kv, env):
    """int8 copies as float32 (scale * value): as many as span twice the
    last-level cache (at least 2, or 1 when one copy alone is larger),
    Skip past --max-dequant-gib."""
    import numpy as np

    one = 2 * c["B"] * c["Hkv"] * c["S"] * c["E"] * 4
    want = max(1 if one >= 2 * env["l3"] else 2, math.ceil(2 * env["l3"] / one))
    copies = min(len(kv), want)
    if copies * one > env["max_dequant"]:
        raise Skip(
            f"the dequantised float32 K, V would take {copies * one / 2**30:.1f} GiB "
            f"(--max-dequant-gib)"
        )
    return [tuple(vs[0].astype(np.float32) * vs[1] for vs in pair) for pair in kv[:copies]]


def run_torch_sdpa(c, q, kv, env):
    import torch
    import torch.nn.functional as F

    dt = c["dtype"]
    note = "Q, K, V, out all 16-bit" if dt in ("f16", "bf16") else ""
    if dt == "int8":
        kv, dt = dequantised(c, kv, env), "f32"
        note = (
            f"int8: on the dequantised float32 K, V ({len(kv)} copies), a reference "
            "point, not an int8 kernel"
        )
    tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dt]
    tq = torch.from_numpy(q).to(tdt)
    tkv = [(as_torch(k, dt), as_torch(v, dt)) for k, v in kv]
    mask, is_causal = None, False
    if c["causal"] and c["kind"] == "prefill":
        is_causal = True  # L == S: top-left = bottom-right
    elif c["causal"] and c["L"] > 1:
        mask = torch.from_numpy(causal_mask(c))
    gqa = {"enable_gqa": True} if c["Hq"] != c["Hkv"] else {}
    res = [None]

    def f(i):
        k, v = tkv[i % len(tkv)]
        res[0] = F.scaled_dot_product_attention(
            tq, k, v, attn_mask=mask, is_causal=is_causal, **gqa
        )

    return f, lambda: res[0].float().numpy(), note


def run_torch_matmul(c, q, kv, env):
    import torch

    B, Hq, Hkv, L, S, E = (c[x] for x in ("B", "Hq", "Hkv", "L", "S", "E"))
    G = Hq // Hkv
    if c["dtype"] == "int8":
        raise Skip("int8: not run (torch SDPA gives the dequantised float32 reference)")
    if B * Hq * L * S * 4 > env["max_scores"]:
        raise Skip(f"the scores would take {B * Hq * L * S * 4 / 2**30:.0f} GiB (--max-scores-gib)")
    dt = c["dtype"]
    tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dt]
    tq = torch.from_numpy(q).to(tdt).reshape(B, Hkv, G * L, E)
    tkv = [(as_torch(k, dt), as_torch(v, dt)) for k, v in kv]
    add = None
    if c["causal"] and L > 1:
        add = torch.zeros(G * L, S, dtype=tdt).masked_fill_(
            torch.from_numpy(~causal_mask(c, G)), float("-inf")
        )
    scale = 1.0 / math.sqrt(E)
    res = [None]

    def f(i):
        k, v = tkv[i % len(tkv)]
        s = torch.matmul(tq, k.transpose(-2, -1)).mul_(scale)
        if add is not None:
            s.add_(add)
        res[0] = torch.matmul(torch.softmax(s, dim=-1), v)

    return (
        f,
        lambda: res[0].float().numpy().reshape(B, Hq, L, E),
        "all 16-bit" if dt != "f32" else "",
    )


ONNX_OPSET = 17  # ai.onnx opset of the models: every onnxruntime since 1.13 runs it


def onnx_model(nodes, inputs, outputs, opset=ONNX_OPSET):
    """A model stamped with the oldest IR version its opset needs (IR 8 for
    opset 17), not the installed onnx's newest: make_model's default
    (onnx.IR_VERSION, 11 and up) is refused by an older onnxruntime
    ("Unsupported model IR version"); ort_session also steps down on that
    message."""
    from onnx import helper

    g = helper.make_graph(nodes, "attention", inputs, outputs)
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = min(
        m.ir_version, helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    )
    return m


IR_REFUSED = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")


def ort_session(model, threads):
    """A CPU session; a model whose IR version the runtime refuses is
    stamped with the runtime's newest one (from its message) and loaded again."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
        refused = IR_REFUSED.search(str(e))
        if not refused or int(refused.group(2)) >= model.ir_version:
            raise
        model.ir_version = int(refused.group(2))
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )


def require(module: str, impl: str):
    """Imports an optional peer's module, or skips the implementation."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Skip(f"{module} is not installed ({e}); pip install {module} to run {impl}") from None


def bsh(a):
    """[B, H, S, E] -> [B, S, H*E], a copy (ORT's contrib layout)."""
    import numpy as np

    return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1))


def run_ort(c, q, kv, env):
    import numpy as np

    require("onnx", "ONNX Runtime")
    ort = require("onnxruntime", "ONNX Runtime")
    from onnx import TensorProto as TP
    from onnx import helper

    B, Hq, Hkv, L, S, E = (c[x] for x in ("B", "Hq", "Hkv", "L", "S", "E"))
    dt = c["dtype"]
    if dt == "int8":
        raise Skip(
            "int8 K/V: GroupQueryAttention's int8 cache (k_quant_type, v_quant_type) "
            "has one scale per tensor or per channel, not one per token as "
            "quantize_kv's: another format, not run"
        )
    tp = {"f32": TP.FLOAT, "f16": TP.FLOAT16, "bf16": TP.BFLOAT16}[dt]
    npd = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dt]
    vi = helper.make_tensor_value_info
    qx = bsh(q.astype(npd)) if dt != "bf16" else None
    if env["ort_op"] == "matmul":
        return run_ort_matmul(c, q, kv, env)
    try:
        if c["kind"] == "decode":
            node = helper.make_node(
                "GroupQueryAttention",
                ["q", "k", "v", "pk", "pv", "sl", "tl"],
                ["o", "prk", "prv"],
                domain="com.microsoft",
                num_heads=Hq,
                kv_num_heads=Hkv,
            )
            cache = [B, Hkv, S, E]
            m = onnx_model(
                [node],
                [
                    vi("q", tp, [B, L, Hq * E]),
                    vi("k", tp, [B, L, Hkv * E]),
                    vi("v", tp, [B, L, Hkv * E]),
                    vi("pk", tp, cache),
                    vi("pv", tp, cache),
                    vi("sl", TP.INT32, [B]),
                    vi("tl", TP.INT32, []),
                ],
                [vi("o", tp, [B, L, Hq * E]), vi("prk", tp, cache), vi("prv", tp, cache)],
            )
            note = "com.microsoft GroupQueryAttention, shared past/present K/V buffers"
        elif not c["causal"]:
            node = helper.make_node(
                "MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=Hq
            )
            m = onnx_model(
                [node], [vi(n, tp, [B, L, Hq * E]) for n in "qkv"], [vi("o", tp, [B, L, Hq * E])]
            )
            note = "com.microsoft MultiHeadAttention"
        else:
            node = helper.make_node(
                "GroupQueryAttention",
                ["q", "k", "v", "", "", "sl", "tl"],
                ["o", "prk", "prv"],
                domain="com.microsoft",
                num_heads=Hq,
                kv_num_heads=Hkv,
            )
            m = onnx_model(
                [node],
                [vi(n, tp, [B, L, Hq * E]) for n in "qkv"]
                + [vi("sl", TP.INT32, [B]), vi("tl", TP.INT32, [])],
                [vi("o", tp, [B, L, Hq * E]), vi("prk", tp, None), vi("prv", tp, None)],
            )
            note = "com.microsoft GroupQueryAttention (causal)"
        sess = ort_session(m, env["threads"])
    except Exception as e:  # noqa: BLE001 - the op's own message is the report
        if dt != "f32":
            why = str(e).splitlines()[0].split("NOT_IMPLEMENTED : ")[-1].split(" node ")[0]
            raise Skip(f"no {dt} CPU kernel ({why})") from None
        f, get, _ = run_ort_matmul(c, q, kv, env)
        return f, get, f"MatMul+Softmax+MatMul (contrib op failed: {str(e)[:80]})"
    if dt == "bf16":
        raise Skip("bfloat16 not tried (no ORT CPU kernel)")
    out = np.empty((B, L, Hq * E), npd)
    lens = {"sl": np.full(B, S - 1, np.int32), "tl": np.array(S, np.int32)}
    if c["kind"] == "decode":
        binds = []
        for k, v in kv:
            io = sess.io_binding()
            io.bind_cpu_input("q", qx)
            io.bind_cpu_input("k", bsh(k[:, :, S - L :]))
            io.bind_cpu_input("v", bsh(v[:, :, S - L :]))
            for name in ("sl", "tl"):
                io.bind_cpu_input(name, lens[name])
            ok, ov_ = ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v)
            assert ok.data_ptr() == k.ctypes.data  # the cache is not copied
            io.bind_ortvalue_input("pk", ok)
            io.bind_ortvalue_input("pv", ov_)
            io.bind_ortvalue_output("prk", ok)
            io.bind_ortvalue_output("prv", ov_)
            io.bind_output("o", "cpu", 0, npd, out.shape, out.ctypes.data)
            binds.append(io)

        def f(i):
            sess.run_with_iobinding(binds[i % len(binds)])
    else:
        feeds = {"q": qx, "k": bsh(kv[0][0]), "v": bsh(kv[0][1])}
        if c["causal"]:
            feeds.update(lens)
        res = [None]

        def f(i):
            res[0] = sess.run(["o"], feeds)[0]

        out = None
    get = lambda: (
        (out if out is not None else res[0])
        .astype(np.float32)
        .reshape(B, L, Hq, E)
        .transpose(0, 2, 1, 3)
    )
    return f, get, note + (" (Q, K, V, out float16)" if dt == "f16" else "")


def run_ort_matmul(c, q, kv, env):
    """Plain ONNX MatMul + Softmax + MatMul, float32 only."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    B, Hq, Hkv, L, S, E = (c[x] for x in ("B", "Hq", "Hkv", "L", "S", "E"))
    G = Hq // Hkv
    if c["dtype"] != "f32":
        raise Skip("MatMul fallback in float32 only")
    if B * Hq * L * S * 4 > env["max_scores"]:
        raise Skip("MatMul fallback: the scores would not fit (--max-scores-gib)")
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
    ]
    inits = [numpy_helper.from_array(np.array(1 / math.sqrt(E), np.float32), "scale")]
    last = "s1"
    if c["causal"] and L > 1:
        add = np.where(causal_mask(c, G), 0, -np.inf).astype(np.float32)
        inits.append(numpy_helper.from_array(add, "mask"))
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        last = "s2"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    m = onnx_model(
        nodes,
        [
            vi("q", TP.FLOAT, [B, Hkv, G * L, E]),
            vi("k", TP.FLOAT, [B, Hkv, S, E]),
            vi("v", TP.FLOAT, [B, Hkv, S, E]),
        ],
        [vi("o", TP.FLOAT, [B, Hkv, G * L, E])],
    )
    m.graph.initializer.extend(inits)
    sess = ort_session(m, env["threads"])
    qg = q.reshape(B, Hkv, G * L, E)
    res = [None]

    def f(i):
        k, v = kv[i % len(kv)]
        res[0] = sess.run(["o"], {"q": qg, "k": k, "v": v})[0]

    return f, lambda: res[0].reshape(B, Hq, L, E), "MatMul+Softmax+MatMul (--ort-op matmul)"


def run_openvino(c, q, kv, env):
    import numpy as np

    ov = require("openvino", "OpenVINO")
    from openvino import opset13 as ops

    B, Hq, Hkv, L, S, E = (c[x] for x in ("B", "Hq", "Hkv", "L", "S", "E"))
    G = Hq // Hkv
    dt = c["dtype"]
    t = {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16, "int8": ov.Type.i8}[dt]
    pq = ops.parameter([B, Hkv, G * L, E], ov.Type.f32, name="q")
    pk, pv = (ops.parameter([B, Hkv, S, E], t, name=n) for n in "kv")
    params = [pq, pk, pv]
    if dt == "int8":  # scale * value, rounded once to f32: softdot's dequantised value
        pks, pvs = (ops.parameter([B, Hkv, S, 1], ov.Type.f32, name=n) for n in ("ks", "vs"))
        params += [pks, pvs]
        k = ops.multiply(ops.convert(pk, ov.Type.f32), pks)
        v = ops.multiply(ops.convert(pv, ov.Type.f32), pvs)
    elif dt == "f32":
        k, v = pk, pv
    else:
        k, v = ops.convert(pk, ov.Type.f32), ops.convert(pv, ov.Type.f32)
    if c["kind"] == "prefill":
        o = ops.scaled_dot_product_attention(pq, k, v, causal=c["causal"])
    elif c["causal"] and L > 1:
        o = ops.scaled_dot_product_attention(pq, k, v, ops.constant(causal_mask(c, G)))
    else:
        o = ops.scaled_dot_product_attention(pq, k, v)
    hint = dt if sixteen_bit_prefill(c) else "f32"
    cfg = {
        "INFERENCE_NUM_THREADS": env["threads"],
        "INFERENCE_PRECISION_HINT": hint,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
    }
    compiled = ov.Core().compile_model(ov.Model([o], params, "sdpa"), "CPU", cfg)
    got_hint = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    if hint == "f32":
        assert got_hint in ("<Type: 'float32'>", "f32")
    if sixteen_bit_prefill(c):
        q = q16(c, q)[1]
    req = compiled.create_infer_request()

    def tensor(a):
        return (
            ov.Tensor(a, list(a.shape), ov.Type.bf16)
            if dt == "bf16"
            else ov.Tensor(a, shared_memory=True)
        )

    tq = ov.Tensor(np.ascontiguousarray(q.reshape(B, Hkv, G * L, E)), shared_memory=True)
    if dt == "int8":
        feeds = [
            {
                "q": tq,
                "k": tensor(k_[0]),
                "v": tensor(v_[0]),
                "ks": tensor(k_[1]),
                "vs": tensor(v_[1]),
            }
            for k_, v_ in kv
        ]
    else:
        feeds = [{"q": tq, "k": tensor(k_), "v": tensor(v_)} for k_, v_ in kv]

    def f(i):
        req.infer(feeds[i % len(feeds)], share_inputs=True)

    layers = set()  # the compiled graph's nodes and their kernels (ISA)
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind, prim = info["layerType"].astype(str), info["primitiveType"].astype(str)
        if kind not in ("Input", "Output", "Const"):
            layers.add(kind + ("" if prim.startswith("unknown") else f" ({prim})"))
    layers = sorted(layers)
    note = (
        f"ScaledDotProductAttention (opset13), {hint} hint (got {got_hint}); CPU graph: "
        + ", ".join(layers)
        + (
            "; int8 K, V and scales as inputs, Convert + Multiply to f32 in front"
            if dt == "int8"
            else "; K, V converted to f32"
            if dt != "f32"
            else ""
        )
    )
    return f, lambda: req.get_output_tensor(0).data.reshape(B, Hq, L, E).copy(), note


RUNNERS = {
    "softdot": run_softdot,
    "softdot split": run_softdot_split,
    "torch SDPA": run_torch_sdpa,
    "torch matmul": run_torch_matmul,
    "ONNX Runtime": run_ort,
    "OpenVINO": run_openvino,
}


# ---- child: one thread count -------------------------------------------------
def rooflines(arena, threads, min_time):
    """Read bandwidth (bytes/s) over `arena` (float32): torch.sum and numpy's
    add.reduce split over `threads` Python threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    t = torch.from_numpy(arena)
    chunks = np.array_split(arena, threads)
    pool = ThreadPoolExecutor(threads)
    res = {
        "torch.sum": arena.nbytes / best_time(lambda i: t.sum(), min_time),
        "numpy add.reduce": arena.nbytes
        / best_time(lambda i: list(pool.map(np.add.reduce, chunks)), min_time),
    }
    pool.shutdown()
    return res


def version_of(module: str) -> str:
    """The installed version of an optional peer, or "not installed"."""
    import importlib

    try:
        return importlib.import_module(module).__version__
    except ImportError:
        return "not installed"


def child(args) -> dict:
    import numpy as np
    import torch

    import softdot

    th = args.child
    torch.set_num_threads(th)
    if args.target:
        softdot.force_simd_target(args.target)
    env = {
        "threads": th,
        "max_scores": args.max_scores_gib * 2**30,
        "ort_op": args.ort_op,
        "max_dequant": args.max_dequant_gib * 2**30,
        "l3": l3_bytes(),
    }
    mt = 0.05 if args.quick else 0.1
    todo = [c for c in cases(args.quick) if re.search(args.filter, c["label"])]
    decode_bytes = [kv_bytes(c) for c in todo if c["kind"] == "decode"]
    l3 = env["l3"]
    arena_bytes = max([2 * l3] + [2 * b for b in decode_bytes])
    arenas = Arenas(arena_bytes)
    header = {
        "cpu": cpu_model(),
        "l3_bytes": l3,
        "arena_bytes": arena_bytes,
        "softdot": softdot.__version__,
        "target": softdot.simd_target(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onnxruntime": version_of("onnxruntime"),
        "onnx": version_of("onnx"),
        "openvino": version_of("openvino"),
        "isa_limits": {k: os.environ[k] for k in AVX2_ENV if k in os.environ},
    }
    run = {"threads": th, "results": [], "roofline": {}, "sgemm_gflops": None}
    if decode_bytes:
        print(f"[{th} thread(s)] read roofline over {arena_bytes / 2**20:.0f} MiB", file=sys.stderr)
        run["roofline"] = rooflines(arenas.get("f32"), th, mt)
    if any(c["kind"] == "prefill" for c in todo):
        a = torch.randn(1024, 1024)
        run["sgemm_gflops"] = 2 * 1024**3 / best_time(lambda i: torch.mm(a, a), mt) / 1e9
    roof = max(run["roofline"].values(), default=None)
    rng = np.random.default_rng(2)
    for c in todo:
        print(f"[{th} thread(s)] {c['label']}", file=sys.stderr, flush=True)
        q = rng.standard_normal((c["B"], c["Hq"], c["L"], c["E"]), dtype=np.float32)
        if c["kind"] == "decode":
            kv = arenas.kv(c)
        else:
            kv = Arenas(2 * c["B"] * c["Hkv"] * c["S"] * c["E"] * ITEMSIZE[c["dtype"]], seed=3).kv(
                c
            )
        nbytes = kv_bytes(c)
        flops = 4.0 * c["B"] * c["Hq"] * c["L"] * c["S"] * c["E"]
        if c["kind"] == "prefill" and c["causal"]:
            flops /= 2
        ref = None
        for name in IMPLS:
            r = {"case": c, "impl": name, "copies": len(kv)}
            if name == "torch SDPA" and c["dtype"] == "int8":
                r["impl"] = "torch SDPA (dequantised f32)"  # a reference, not a peer
            try:
                f, get, r["note"] = RUNNERS[name](c, q, kv, env)
                f(0)
                o = get()
                if ref is None:
                    ref = o.copy()
                r["max_abs_diff"] = float(np.max(np.abs(o - ref)))
                if sixteen_bit_prefill(c):
                    r["err_uw"] = accuracy(c, q, kv, o)
                r["seconds"] = t = best_time(f, mt)
                r["kv_gbs"] = nbytes / t / 1e9
                r["gflops"] = flops / t / 1e9
                if roof and c["kind"] == "decode":
                    r["of_roofline"] = nbytes / t / roof
                if run["sgemm_gflops"] and c["kind"] == "prefill":
                    r["of_sgemm"] = r["gflops"] / run["sgemm_gflops"]
            except Skip as e:
                r["skipped"] = str(e)
            except Exception as e:  # noqa: BLE001 - a peer's failure is a result
                r["skipped"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            f = get = None
            run["results"].append(r)
            time.sleep(0.02)  # let the previous runtime's spinning threads go to sleep
    return {"header": header, "run": run}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="no n_kv = 131072 nor n = 16384; loops of 0.05 s"
    )
    ap.add_argument("--filter", default="", help="regex on the case labels, e.g. 'decode f32'")
    ap.add_argument(
        "--target",
        default=os.environ.get("SOFTDOT_BENCH_TARGET") or None,
        help="force softdot's SIMD target (e.g. AVX2) and limit torch/MKL/oneDNN/"
        "numpy to AVX2 too; default $SOFTDOT_BENCH_TARGET",
    )
    ap.add_argument(
        "--max-scores-gib",
        type=float,
        default=4.0,
        help="skip paths that materialise more scores than this (default 4)",
    )
    ap.add_argument(
        "--max-dequant-gib",
        type=float,
        default=4.0,
        help="int8 cases: skip torch SDPA on the dequantised float32 K, V past this (default 4)",
    )
    ap.add_argument(
        "--ort-op",
        choices=["contrib", "matmul"],
        default="contrib",
        help="ONNX Runtime graph (matmul: the MatMul+Softmax+MatMul fallback)",
    )
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--svg", help="draw decode GB/s against n_kv to this SVG file")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return
    threads = (
        [int(t) for t in args.threads.split(",")]
        if args.threads
        else sorted({1, os.cpu_count() or 1})
    )
    header, runs = None, []
    for th in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(th))
        if args.target:
            env["SOFTDOT_BENCH_TARGET"] = args.target
            if args.target.upper() == "AVX2":
                env.update(AVX2_ENV)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            str(th),
            "--filter",
            args.filter,
            "--max-scores-gib",
            str(args.max_scores_gib),
            "--max-dequant-gib",
            str(args.max_dequant_gib),
            "--ort-op",
            args.ort_op,
        ]
        cmd += (["--quick"] if args.quick else []) + (
            ["--target", args.target] if args.target else []
        )
        res = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        header = header or out["header"]
        runs.append(out["run"])
    print(report(header, runs, args.target))
    if args.json:
        write_json(args.json, {"header": header, "target": args.target, "runs": runs})
    if args.svg:
        svg = decode_chart(header, runs)
        if svg is None:
            print("no decode results: no chart", file=sys.stderr)
        else:
            write_svg(args.svg, svg)
            print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
