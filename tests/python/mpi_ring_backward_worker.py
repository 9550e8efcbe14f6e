"""Run by test_distributed.py under mpirun (every rank runs this file):
softdot.distributed.ring_attention_backward on P ranks, after
ring_attention, against a float64 numpy reference of the whole sequence's
gradients (computed on rank 0 from the same seeded arrays). Rank 0 writes
the deterministic gradients, assembled in global order, to argv[1] (.npz)
for the cross-P bitwise comparison; the exit status is 1 when any check
failed on any rank."""

import sys
import traceback

import numpy as np
from mpi4py import MPI

import softdot.distributed as sdist

comm = MPI.COMM_WORLD
P, R = comm.Get_size(), comm.Get_rank()
failures = []
saved = {}


def check(name, cond, detail=""):
    if not cond:
        failures.append(f"rank {R}/{P} {name}: {detail}")


def gather_global(layout, local, n):
    """The rows of every rank in global order (rank 0 only), axis -2."""
    parts = comm.gather((layout.positions(R), local), root=0)
    if R != 0:
        return None
    shape = list(local.shape)
    shape[-2] = n
    g = np.full(shape, np.nan, dtype=local.dtype)
    for pos, a in parts:
        keep = pos < n
        g[..., pos[keep], :] = a[..., np.nonzero(keep)[0], :]
    return g


def reference(q, k, v, dout, causal, sinks):
    """Float64 gradients (dq, dk, dv, dsinks) of attention on [B, H, n, E]."""
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    hq, hk = q.shape[1], k.shape[1]
    kk = np.repeat(k, hq // hk, axis=1)
    vv = np.repeat(v, hq // hk, axis=1)
    scale = np.float64(np.float32(1.0 / np.sqrt(q.shape[-1])))
    s = q @ kk.swapaxes(-1, -2) * scale
    n = q.shape[2]
    if causal:
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    den = np.exp(s - m).sum(axis=-1, keepdims=True)
    if sinks is not None:
        sk = sinks.astype(np.float64)[None, :, None, None]
        den = den + np.exp(sk - m)
    lse = m + np.log(den)
    p = np.exp(s - lse)
    o = p @ vv
    dp = dout @ vv.swapaxes(-1, -2)
    delta = (dout * o).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    dq = scale * ds @ kk
    dk = scale * ds.swapaxes(-1, -2) @ q
    dv = p.swapaxes(-1, -2) @ dout
    g = hq // hk
    dk = dk.reshape(dk.shape[0], hk, g, *dk.shape[2:]).sum(axis=2)
    dv = dv.reshape(dv.shape[0], hk, g, *dv.shape[2:]).sum(axis=2)
    dsinks = None
    if sinks is not None:
        dsinks = -(np.exp(sk - lse) * delta).sum(axis=(0, 2, 3))
    return dq, dk, dv, dsinks


def case(
    name,
    n,
    *,
    layout="zigzag",
    deterministic=False,
    causal=False,
    sinks=False,
    heads=(4, 2),
    E=16,
    Ev=8,
    torch_io=False,
):
    rng = np.random.default_rng(n + 7)
    hq, hk = heads
    q = rng.uniform(-1.5, 1.5, (2, hq, n, E)).astype(np.float32)
    k = rng.uniform(-1.5, 1.5, (2, hk, n, E)).astype(np.float32)
    v = rng.uniform(-1, 1, (2, hk, n, Ev)).astype(np.float32)
    dout = rng.uniform(-1, 1, (2, hq, n, Ev)).astype(np.float32)
    sk = rng.uniform(-1, 1, hq).astype(np.float32) if sinks else None
    L = sdist.ring_layout(n, P, layout=layout, deterministic=deterministic)
    lq, lk, lv, ldo = (L.shard(x, R) for x in (q, k, v, dout))
    kw = dict(seq_len=n, layout=layout, deterministic=deterministic, causal=causal, sinks=sk)
    if torch_io:
        import torch

        lq, lk, lv, ldo = (torch.from_numpy(x).requires_grad_() for x in (lq, lk, lv, ldo))
        if sk is not None:
            kw["sinks"] = torch.from_numpy(sk)
        with torch.no_grad():
            out, lse = sdist.ring_attention(comm, lq, lk, lv, return_lse=True, **kw)
    else:
        out, lse = sdist.ring_attention(comm, lq, lk, lv, return_lse=True, **kw)
    grads = sdist.ring_attention_backward(comm, lq, lk, lv, out, lse, ldo, **kw)
    again = sdist.ring_attention_backward(comm, lq, lk, lv, out, lse, ldo, **kw)
    check(name + " count", len(grads) == (4 if sinks else 3), len(grads))
    if torch_io:
        import torch

        check(name + " torch", all(isinstance(g, torch.Tensor) for g in grads))
        grads = tuple(g.numpy() for g in grads)
        again = tuple(g.numpy() for g in again)
    for a, b in zip(grads, again):
        check(name + " run to run", np.array_equal(a, b))
    if torch_io:
        # ring_attention under autograd: its backward is ring_attention_backward,
        # so the gradients are the same bits.
        tq, tk, tv = (t.detach().clone().requires_grad_() for t in (lq, lk, lv))
        ts = kw["sinks"].clone().requires_grad_() if sinks else None
        o2 = sdist.ring_attention(comm, tq, tk, tv, **dict(kw, sinks=ts))
        o2.backward(ldo.detach())
        check(name + " autograd out", np.array_equal(o2.detach().numpy(), out.numpy()))
        auto = [tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()]
        if sinks:
            auto.append(ts.grad.numpy())
        for nm, a, b in zip(("dq", "dk", "dv", "dsinks"), auto, grads):
            check(f"{name} autograd {nm}", np.array_equal(a, b))
    dq, dk, dv = grads[:3]
    check(name + " shapes", dq.shape == lq.shape and dk.shape == lk.shape and dv.shape == lv.shape)
    pad = L.positions(R) >= n
    for g in (dq, dk, dv):
        check(name + " padding rows zero", np.all(g[..., pad, :] == 0))
    gq, gk, gv = (gather_global(L, x, n) for x in (dq, dk, dv))
    ds = grads[3] if sinks else None
    if ds is not None:
        every = comm.gather(ds, root=0)
        if R == 0:
            check(name + " dsinks same on every rank", all(np.array_equal(e, ds) for e in every))
    if R != 0:
        return
    want = reference(q, k, v, dout, causal, sk)
    for nm, got, w in zip(("dq", "dk", "dv", "dsinks"), (gq, gk, gv, ds), want):
        if w is None:
            continue
        err = float(np.max(np.abs(got - w)))
        tol = 2e-5 * (1 + float(np.max(np.abs(w))))
        check(f"{name} {nm}", err <= tol, f"max err {err:.3g} > {tol:.3g}")
    if deterministic:
        saved[name + "_dq"], saved[name + "_dk"], saved[name + "_dv"] = gq, gk, gv
        if ds is not None:
            saved[name + "_dsinks"] = ds


def run(name, **kw):
    try:
        case(name, **kw)
    except Exception:
        failures.append(f"rank {R}/{P} {name}: {traceback.format_exc()}")


for det in (False, True):
    for layout in ("zigzag", "contiguous"):
        for causal in (False, True):
            run(
                f"plain {layout} causal={causal} det={det}",
                n=150,
                layout=layout,
                deterministic=det,
                causal=causal,
            )
    run(f"sinks gqa det={det}", n=200, deterministic=det, causal=True, sinks=True, heads=(4, 1))
run("torch io", n=90, causal=True, sinks=True, torch_io=True, deterministic=True)

# A grad_out of the wrong shape on the last rank only: every rank raises.
try:
    L = sdist.ring_layout(64, P)
    x = np.zeros((1, 1, L.rows, 8), np.float32)
    lse = np.zeros((1, 1, L.rows), np.float32)
    bad = np.zeros((1, 1, L.rows + (1 if R == P - 1 else 0), 8), np.float32)
    sdist.ring_attention_backward(comm, x, x, x, x, lse, bad, seq_len=64)
    check("bad grad_out raises", False, "no error")
except ValueError as e:
    check("bad grad_out message", "grad_out" in str(e), str(e))
except Exception as e:  # noqa: BLE001
    check("bad grad_out type", False, repr(e))

everyone = comm.gather(failures, root=0)
if R == 0:
    bad = [f for fs in everyone for f in fs]
    for f in bad:
        print("FAILED:", f)
    np.savez(sys.argv[1], **{k.replace(" ", "_"): v for k, v in saved.items()})
    print(f"OK P={P}" if not bad else f"FAILED P={P}")
    sys.exit(1 if bad else 0)
