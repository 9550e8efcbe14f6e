"""Run by test_distributed.py under mpirun (every rank runs this file):
softdot.distributed.ring_attention on P ranks against the one-process
softdot.scaled_dot_product_attention of the whole sequence, and the
vocabulary-parallel softmax, log_softmax, logsumexp and cross_entropy (with
its gradient) against the one-process functions on the whole rows, computed
on every rank from the same seeded arrays. Rank 0 writes the deterministic
results, assembled in global order, to argv[1] (.npz) for the cross-P bitwise
comparison, and every rank's failures are gathered: the exit status is 1 when
any check failed on any rank."""

import sys
import traceback

import numpy as np
from mpi4py import MPI

import softdot
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


def case(
    name,
    n,
    *,
    layout="zigzag",
    deterministic=False,
    causal=False,
    kv="float32",
    mask=None,
    window=(-1, -1),
    softcap=0.0,
    sinks=None,
    heads=(4, 2),
    E=16,
    Ev=16,
    torch_io=False,
    nan_key=None,
    alibi_slopes=None,
    scale=None,
    precise=False,
):
    rng = np.random.default_rng(sum(name.encode()) * 7919 + n)
    hq, hkv = heads
    q = rng.standard_normal((2, hq, n, E)).astype(np.float32)
    k = rng.standard_normal((2, hkv, n, E)).astype(np.float32)
    v = rng.standard_normal((2, hkv, n, Ev)).astype(np.float32)
    if nan_key is not None:
        k[0, 0, nan_key, 0] = np.nan
    if kv == "float16":
        k, v = k.astype(np.float16), v.astype(np.float16)
    L = sdist.ring_layout(n, P, layout=layout, deterministic=deterministic)
    qs, ks, vs = L.shard(q, R), L.shard(k, R), L.shard(v, R)
    ms = None if mask is None else L.shard(mask, R, axis=-2)
    kw = dict(
        causal=causal,
        window=window,
        softcap=softcap,
        sinks=sinks,
        alibi_slopes=alibi_slopes,
        scale=scale,
        precise=precise,
    )
    if kv == "int8":
        kq, vq = softdot.quantize_kv(k), softdot.quantize_kv(v)
        ks = tuple(L.shard(a, R) for a in kq)
        vs = tuple(L.shard(a, R) for a in vq)
        k, v = kq, vq
    if torch_io:
        import torch

        qs, ks, vs = (torch.from_numpy(a) for a in (qs, ks, vs))
        ms = None if ms is None else torch.from_numpy(ms)
    out, lse = sdist.ring_attention(
        comm,
        qs,
        ks,
        vs,
        ms,
        seq_len=n,
        layout=layout,
        deterministic=deterministic,
        return_lse=True,
        **kw,
    )
    if torch_io:
        import torch

        check(name + " torch out", isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor))
        out, lse = out.numpy(), lse.numpy()
    ref, ref_lse = softdot.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    pos = L.positions(R)
    keep = pos < n
    rows = np.nonzero(keep)[0]
    got, want = out[..., rows, :], ref[..., pos[keep], :]
    check(name + " shape", out.shape == (2, hq, L.rows, Ev), out.shape)
    check(
        name + " padding rows",
        np.all(out[..., ~keep, :] == 0) and np.all(lse[..., ~keep] == -np.inf),
    )
    if P == 1 and not deterministic and layout == "contiguous":
        # One rank, one chunk: attention()'s bits (the zigzag layout's two
        # query chunks are merged partials, within the bound but not bitwise).
        check(
            name + " P=1 bitwise",
            np.array_equal(got, want, equal_nan=True)
            and np.array_equal(lse[..., rows], ref_lse[..., pos[keep]], equal_nan=True),
        )
    # attention()'s bound, loosely: a few hundred u of sum |w V| <= max |V|.
    tol = 2.0**-16 * float(
        np.nanmax(np.abs(np.asarray(v[0] if kv == "int8" else v, dtype=np.float32))) + 1
    )
    same_nan = np.array_equal(np.isnan(got), np.isnan(want))
    err = float(np.nanmax(np.abs(got - want))) if np.isfinite(want).any() else 0.0
    check(name + " values", same_nan and err <= tol, f"max err {err:.3g} > {tol:.3g}")
    lg, lw = lse[..., rows], ref_lse[..., pos[keep]]
    fin = np.isfinite(lw)
    check(
        name + " lse",
        np.array_equal(np.isfinite(lg), fin)
        and np.array_equal(lg[~fin], lw[~fin], equal_nan=True)
        and (not fin.any() or float(np.max(np.abs(lg[fin] - lw[fin]))) <= 1e-5),
    )
    if deterministic:
        g = gather_global(L, out, n)
        gl = gather_global(L, lse[..., None], n)
        if R == 0:
            saved[name] = g
            saved[name + " lse"] = gl
    return out, lse, L


def run(name, **kw):
    try:
        return case(name, **kw)
    except Exception:  # noqa: BLE001 - recorded, every rank goes on
        failures.append(f"rank {R}/{P} {name}: {traceback.format_exc()}")
        return None


n = 37  # not a multiple of 2P for P = 2..4
run("plain", n=n)
run("causal zigzag", n=n, causal=True)
run("causal contiguous", n=n, causal=True, layout="contiguous")
run("plain contiguous", n=n, layout="contiguous", kv="float16", softcap=20.0)
run("deterministic", n=n, causal=True, deterministic=True)
run("deterministic plain", n=150, deterministic=True, layout="contiguous")
run(
    "float16 window softcap sinks",
    n=n,
    kv="float16",
    causal=True,
    window=(5, 0),
    softcap=30.0,
    sinks=np.array([0.5, -1.0, 0.0, 2.0], np.float32),
)
run("int8", n=n, kv="int8", causal=True)
run("mha", n=n, heads=(2, 2), Ev=8)
# A query row masked against every key on every rank: zeros, lse -inf.
mask = np.random.default_rng(3).random((2, 4, n, n)) < 0.8
mask[:, :, 5, :] = False
r = run("masked row", n=n, mask=mask)
if r is not None:
    out, lse, L = r
    pos = L.positions(R)
    rows = np.nonzero(pos == 5)[0]
    check("masked row zeros", np.all(out[..., rows, :] == 0) and np.all(lse[..., rows] == -np.inf))
run("nan key", n=n, nan_key=11)
# Every option of the request on the ring (the table: each option against
# the one-process call, for every P of test_distributed.py), ALiBi first:
# its distances are global positions on every step of the ring.
slopes = np.array([0.5, 0.125, 0.25, 0.0625], np.float32)
run("alibi causal", n=301, E=32, causal=True, alibi_slopes=slopes)
run("alibi deterministic", n=150, causal=True, deterministic=True, alibi_slopes=slopes)
run(
    "alibi window softcap scale mask",
    n=n,
    layout="contiguous",
    alibi_slopes=slopes,
    window=(9, 3),
    softcap=3.0,
    scale=0.2,
    mask=mask,
)
run("scale precise", n=n, causal=True, scale=0.7, precise=True)
run("window only", n=n, window=(4, 6))
# Options that differ between ranks: every rank raises, naming the option.
if P > 1:
    for opt, mine in (
        ("alibi_slopes values", dict(alibi_slopes=slopes * (2 if R == 1 else 1))),
        ("causal", dict(causal=R == 1)),
        ("scale", dict(scale=0.5 if R == 1 else 0.25)),
        ("sinks values", dict(sinks=slopes + (1 if R == 1 else 0))),
    ):
        L1 = sdist.ring_layout(16, P)
        x = np.ones((1, 4, L1.rows, 8), np.float32)
        try:
            sdist.ring_attention(comm, x, x[:, :2], x[:, :2], seq_len=16, **mine)
            check("differs " + opt, False, "no error")
        except ValueError as e:
            check("differs " + opt, f"{opt} differs" in str(e), str(e))
run("torch", n=n, causal=True, torch_io=True)


def second_derivative():
    """A gradient penalty through the ring's autograd Function raises (its
    backward, collective, runs on every rank; differentiating its gradients
    is refused rather than done without the second-order terms)."""
    import torch

    L1 = sdist.ring_layout(20, P)
    g = np.random.default_rng(9)
    q, k, v = (
        torch.from_numpy(L1.shard(g.standard_normal((1, 2, 20, 4)).astype(np.float32), R))
        for _ in range(3)
    )
    for t in (q, k, v):
        t.requires_grad_()
    out = sdist.ring_attention(comm, q, k, v, seq_len=20, causal=True)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    try:
        ((gq * gq).sum() + q.sum()).backward()
        check("no second derivative", False, "the penalty ran")
    except RuntimeError as e:
        check("no second derivative", "no second derivative" in str(e), str(e))


try:
    second_derivative()
except Exception:  # noqa: BLE001 - recorded, every rank goes on
    failures.append(f"rank {R}/{P} second derivative: {traceback.format_exc()}")

# ---- vocabulary-parallel softmax family and cross-entropy ----------------------


def split(V):
    """Uneven column ranges in rank order; with P >= 3 rank 1 holds none."""
    w = np.array([3 if r % 3 == 0 else (0 if r == 1 and P >= 3 else 2) for r in range(P)], float)
    edges = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * V)]).astype(int)
    return int(edges[R]), int(edges[R + 1])


def gather_cols(local, b, V):
    parts = comm.gather((b, local), root=0)
    if R != 0:
        return None
    g = np.full(local.shape[:-1] + (V,), np.nan, dtype=local.dtype)
    for bb, a in parts:
        g[..., bb : bb + a.shape[-1]] = a
    return g


def ulps(a, b):
    """Largest distance in ulps of b (finite entries), and whether the
    non-finite entries agree bit for bit."""
    fin = np.isfinite(b)
    same = np.array_equal(a[~fin], b[~fin], equal_nan=True) and np.all(np.isfinite(a[fin]))
    if not fin.any():
        return 0.0, same
    return float(
        np.max(np.abs(a[fin].astype(np.float64) - b[fin]) / np.spacing(np.abs(b[fin])))
    ), same


def vocab_case(name, dtype, deterministic, torch_io=False):
    V = 61
    rng = np.random.default_rng(sum(name.encode()))
    x = (rng.standard_normal((7, V)) * 4).astype(dtype)
    x[1] = -np.inf  # -inf on every rank
    x[2, 40] = np.nan  # NaN on one rank only
    x[3, 5] = x[3, 55] = np.inf  # +inf on two ranks (P >= 2)
    t = rng.integers(0, V, size=7)
    t[4] = -100  # ignored
    b, e = split(V)
    xs = np.ascontiguousarray(x[:, b:e])
    xin, tin = xs, t
    if torch_io:
        import torch

        xin, tin = torch.from_numpy(xs), torch.from_numpy(t)
    kw = dict(deterministic=deterministic)
    y = sdist.softmax(comm, xin, b, **kw)
    ly = sdist.log_softmax(comm, xin, b, **kw)
    lse = sdist.logsumexp(comm, xin, b, **kw)
    loss, g = sdist.cross_entropy(comm, xin, b, tin, label_smoothing=0.1, grad=True, **kw)
    lrows = sdist.cross_entropy(comm, xin, b, tin, reduction="none", **kw)
    if torch_io:
        import torch

        check(name + " torch", all(isinstance(a, torch.Tensor) for a in (y, ly, lse, g, lrows)))
        y, ly, lse, g, lrows, loss = (a.numpy() for a in (y, ly, lse, g, lrows, loss))
    check(name + " logits unchanged", np.array_equal(xs, x[:, b:e], equal_nan=True))
    ry = softdot.softmax(x)[:, b:e]
    rly = softdot.log_softmax(x)[:, b:e]
    rlse = softdot.logsumexp(x, axis=-1)
    rloss, rg = softdot.cross_entropy(x, t, label_smoothing=0.1, grad=True)
    rlrows = softdot.cross_entropy(x, t, reduction="none")
    u, same = ulps(y, ry)
    check(name + " softmax", same and u <= 1, f"{u} ulp")
    fin = np.isfinite(rly)
    small = 2.0**-22 if dtype == np.float32 else 2.0**-51
    err = np.abs(ly[fin].astype(np.float64) - rly[fin])
    check(
        name + " log_softmax",
        np.array_equal(ly[~fin], rly[~fin], equal_nan=True)
        and np.all(err <= 2 * np.spacing(np.abs(rly[fin])) + small),
    )
    u, same = ulps(lse, rlse)
    check(name + " logsumexp", same and u <= 2, f"{u} ulp")
    u, same = ulps(lrows, rlrows)
    check(name + " cross_entropy rows", same and u <= 2, f"{u} ulp")
    u, same = ulps(np.asarray(loss), np.asarray(rloss))
    check(name + " cross_entropy mean", same and u <= 2, f"{u} ulp")
    rgs = rg[:, b:e]
    fin = np.isfinite(rgs)
    check(
        name + " grad",
        np.array_equal(g[~fin], rgs[~fin], equal_nan=True)
        and np.all(
            np.abs(g[fin].astype(np.float64) - rgs[fin])
            <= 3
            * np.spacing(np.float64(np.max(np.abs(rgs[fin])) if fin.any() else 1).astype(dtype))
        ),
    )
    check(name + " all -inf row", np.all(y[1] == 0) and lse[1] == -np.inf)
    check(name + " NaN row everywhere", np.all(np.isnan(y[2])) and np.isnan(lse[2]))
    check(name + " +inf shares", np.all(y[3][np.isposinf(xs[3])] == 0.5))
    if deterministic:
        for key, a in (("y", y), ("ly", ly), ("g", g)):
            gg = gather_cols(a, b, V)
            if R == 0:
                saved[f"{name} {key}"] = gg
        if R == 0:
            saved[f"{name} lse"] = lse[None, :]
            saved[f"{name} loss"] = np.asarray(loss).reshape(1, 1)


for dt in (np.float32, np.float64):
    for det in (False, True):
        try:
            vocab_case(f"vocab {np.dtype(dt).name}{' deterministic' if det else ''}", dt, det)
        except Exception:  # noqa: BLE001
            failures.append(f"rank {R}/{P} vocab {dt}: {traceback.format_exc()}")
try:
    vocab_case("vocab torch", np.float32, False, torch_io=True)
except Exception:  # noqa: BLE001
    failures.append(f"rank {R}/{P} vocab torch: {traceback.format_exc()}")


def lce_case(name, dtype, deterministic, torch_io=False):
    """The vocabulary-parallel linear + cross-entropy against the one-process
    call on the whole weight (bitwise on one rank)."""
    N, D, V = 9, 6, 61
    rng = np.random.default_rng(sum(name.encode()))
    h = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.standard_normal((V, D)).astype(np.float32)
    if dtype != np.float32:
        h, w = h.astype(dtype), w.astype(dtype)
    t = rng.integers(0, V, size=N)
    t[4] = -100
    b, e = split(V)
    ws = np.ascontiguousarray(w[b:e])
    hin, win, tin = h, ws, t
    if torch_io:
        import torch

        hin, win, tin = torch.from_numpy(h), torch.from_numpy(ws), torch.from_numpy(t)
    loss, gh, gw = sdist.linear_cross_entropy(
        comm, hin, win, b, tin, label_smoothing=0.1, grad=True, deterministic=deterministic
    )
    rows = sdist.linear_cross_entropy(
        comm, hin, win, b, tin, label_smoothing=0.1, reduction="none", deterministic=deterministic
    )
    if torch_io:
        import torch

        check(name + " torch", all(isinstance(a, torch.Tensor) for a in (loss, gh, gw, rows)))
        loss, gh, gw, rows = (a.numpy() for a in (loss, gh, gw, rows))
    rloss, rgh, rgw = softdot.linear_cross_entropy(h, w, t, label_smoothing=0.1, grad=True)
    rrows = softdot.linear_cross_entropy(h, w, t, label_smoothing=0.1, reduction="none")
    check(name + " shapes", gh.shape == (N, D) and gw.shape == (e - b, D), f"{gh.shape} {gw.shape}")
    if P == 1 and not deterministic:
        check(
            name + " one rank bitwise",
            np.array_equal(rows, rrows)
            and np.array_equal(gh, rgh)
            and np.array_equal(gw, rgw)
            and float(loss) == float(rloss),
        )
    u, same = ulps(rows, rrows)
    check(name + " loss rows", same and u <= 2, f"{u} ulp")
    u, same = ulps(np.asarray(loss), np.asarray(rloss))
    check(name + " loss", same and u <= 2, f"{u} ulp")
    scale = max(np.max(np.abs(rgh)), np.max(np.abs(rgw)))
    check(name + " grad_hidden", np.max(np.abs(gh - rgh)) <= 1e-6 * scale)
    if e > b:
        check(name + " grad_weight", np.max(np.abs(gw - rgw[b:e])) <= 1e-6 * scale)
    everyone = comm.allgather(gh.tobytes())
    check(name + " grad_hidden the same on every rank", all(x == everyone[0] for x in everyone))
    if deterministic:
        gg = gather_cols(np.ascontiguousarray(gw.T), b, V)
        if R == 0:
            saved[f"{name} gw"] = gg
            saved[f"{name} loss"] = np.asarray(loss).reshape(1, 1)
            saved[f"{name} rows"] = rows[None, :]


for det in (False, True):
    try:
        lce_case(f"vocab lce float32{' deterministic' if det else ''}", np.float32, det)
    except Exception:  # noqa: BLE001
        failures.append(f"rank {R}/{P} vocab lce: {traceback.format_exc()}")
try:
    import ml_dtypes

    lce_case("vocab lce bfloat16", ml_dtypes.bfloat16, False)
    lce_case("vocab lce torch", np.float32, False, torch_io=True)
except Exception:  # noqa: BLE001
    failures.append(f"rank {R}/{P} vocab lce: {traceback.format_exc()}")
# A hidden that differs on the last rank: ValueError on every rank.
try:
    hb = np.ones((3, 4), np.float32)
    if R == P - 1 and P > 1:
        hb[1, 2] = 2.0
    b, e = split(10)
    sdist.linear_cross_entropy(comm, hb, np.ones((e - b, 4), np.float32), b, np.array([1, 2, 3]))
    check("lce differing hidden raises", P == 1, "no error")
except ValueError as err:
    check("lce differing hidden message", P > 1 and "differ" in str(err), str(err))

# A bad shard on the last rank only: every rank raises ValueError, none hangs.
L = sdist.ring_layout(n, P)
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 2, L.rows, 8)).astype(np.float32)
kv = rng.standard_normal((1, 2, L.rows, 8)).astype(np.float32)
qbad = q[:, :, :-1] if R == P - 1 else q
try:
    sdist.ring_attention(comm, qbad, kv, kv, seq_len=n)
    check("bad shard raises", False, "no error")
except ValueError as e:
    check("bad shard message", "ring_attention" in str(e) and "rank" in str(e), str(e))
except Exception as e:  # noqa: BLE001
    check("bad shard type", False, repr(e))
# The communicator is still usable, and the library's messages did not leak.
check("comm usable", comm.allreduce(1) == P)

everyone = comm.gather(failures, root=0)
if R == 0:
    bad = [f for fs in everyone for f in fs]
    np.savez(sys.argv[1], **{k.replace(" ", "_"): v for k, v in saved.items()})
    print("\n".join(bad) if bad else f"OK P={P}")
    code = 1 if bad else 0
else:
    code = 0
code = comm.bcast(code, root=0)
sys.exit(code)
