"""softdot.distributed.ring_attention over a torch.distributed process group
(gloo on CPU, no MPI): P = 2 and 3 processes (torch.multiprocessing), the
forward and the autograd backward against the one-process attention and its
gradients, zigzag and contiguous, causal, GQA, sinks, a mask; every other
option of the request (ALiBi, window, soft-cap, scale) the same way; options
that differ between ranks refused on every rank; no second derivative."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

N, B, H, HK, E, EV = 100, 1, 4, 2, 16, 8


def _problem():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, N, E, generator=g)
    k = torch.randn(B, HK, N, E, generator=g)
    v = torch.randn(B, HK, N, EV, generator=g)
    do = torch.randn(B, H, N, EV, generator=g)
    sinks = torch.tensor([0.5, -1.0, 0.25, 1.5])
    mask = torch.rand(B, H, N, N, generator=g) > 0.1
    return q, k, v, do, sinks, mask


# The options of each run beyond the base case's (causal, sinks, a mask).
EXTRA = {
    "base": {},
    "alibi": {"alibi_slopes": torch.tensor([0.5, 0.125, 0.25, 0.0625])},
    "alibi window softcap scale": {
        "alibi_slopes": torch.tensor([0.3, 0.2, 0.1, 0.05]),
        "window": (20, 0),
        "softcap": 4.0,
        "scale": 0.3,
    },
}


def _worker(rank, P, layout, path, out_dir, extra_name):
    import softdot.distributed as sd

    extra = EXTRA[extra_name]
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=P)
    try:
        q, k, v, do, sinks, mask = _problem()
        L = sd.ring_layout(N, P, layout=layout)
        pos = L.positions(rank)
        lq, lk, lv, ldo = (L.shard(x, rank) for x in (q, k, v, do))
        keep = pos < N
        lmask = torch.zeros(B, H, L.rows, N, dtype=torch.bool)
        lmask[:, :, torch.from_numpy(np.nonzero(keep)[0])] = mask[:, :, torch.from_numpy(pos[keep])]
        lq, lk, lv = (t.requires_grad_() for t in (lq, lk, lv))
        ls = sinks.clone().requires_grad_()
        out, lse = sd.ring_attention(
            None,
            lq,
            lk,
            lv,
            lmask,
            seq_len=N,
            layout=layout,
            causal=True,
            sinks=ls,
            return_lse=True,
            group=dist.group.WORLD,
            **extra,
        )
        out.backward(ldo)
        # The same call with the ALiBi slopes (or the causal flag) of rank 1
        # changed: every rank raises, naming what differs.
        differs = []
        for name, mine in (
            (
                "alibi_slopes values",
                {"alibi_slopes": torch.tensor([1.0, 2.0, 3.0, 4.0 + (rank == 1)])},
            ),
            ("causal", {"causal": rank == 1}),
        ):
            try:
                kw = dict(seq_len=N, layout=layout, group=dist.group.WORLD)
                kw.update({"causal": True, **mine})
                sd.ring_attention(None, lq.detach(), lk.detach(), lv.detach(), **kw)
                differs.append(P == 1)
            except ValueError as e:
                differs.append(P > 1 and f"{name} differs between ranks" in str(e))
        np.savez(
            os.path.join(out_dir, f"r{rank}.npz"),
            pos=pos,
            out=out.detach().numpy(),
            lse=lse.detach().numpy(),
            dq=lq.grad.numpy(),
            dk=lk.grad.numpy(),
            dv=lv.grad.numpy(),
            ds=ls.grad.numpy(),
            differs=np.array(differs),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "P,layout,extra",
    [
        (2, "zigzag", "base"),
        (3, "contiguous", "base"),
        (3, "zigzag", "base"),
        (1, "zigzag", "alibi"),
        (2, "zigzag", "alibi"),
        (3, "contiguous", "alibi"),
        (4, "zigzag", "alibi"),
        (3, "zigzag", "alibi window softcap scale"),
    ],
)
def test_gloo_ring_forward_and_backward(tmp_path, P, layout, extra):
    import torch.multiprocessing as mp

    import softdot

    mp.spawn(
        _worker,
        args=(P, layout, str(tmp_path / "store"), str(tmp_path), extra),
        nprocs=P,
        join=True,
    )
    q, k, v, do, sinks, mask = _problem()
    ts = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    ref, ref_lse = softdot.scaled_dot_product_attention(
        ts[0], ts[1], ts[2], mask, causal=True, sinks=ts[3], return_lse=True, **EXTRA[extra]
    )
    ref.backward(do)
    got = {
        n: np.zeros(s)
        for n, s in (("out", ref.shape), ("dq", q.shape), ("dk", k.shape), ("dv", v.shape))
    }
    got_lse = np.zeros(ref_lse.shape)
    ds = []
    for r in range(P):
        z = np.load(tmp_path / f"r{r}.npz")
        keep = z["pos"] < N
        idx, p = np.nonzero(keep)[0], z["pos"][keep]
        for n in got:
            got[n][:, :, p] = z[n][:, :, idx]
        got_lse[:, :, p] = z["lse"][:, :, idx]
        ds.append(z["ds"])
        assert z["differs"].all(), z["differs"]
        # Padding rows: zero output, -inf lse, zero gradients.
        assert np.all(z["out"][:, :, ~keep] == 0) and np.all(z["dq"][:, :, ~keep] == 0)
    want = {"out": ref.detach(), "dq": ts[0].grad, "dk": ts[1].grad, "dv": ts[2].grad}
    for n, w in want.items():
        w = w.numpy()
        err = float(np.max(np.abs(got[n] - w)))
        assert err <= 1e-5 * (1 + float(np.max(np.abs(w)))), (n, err)
    np.testing.assert_allclose(got_lse, ref_lse.detach().numpy(), rtol=1e-6, atol=1e-6)
    for d in ds:  # every rank holds the whole sequence's sinks gradient
        np.testing.assert_allclose(d, ts[3].grad.numpy(), rtol=1e-5, atol=1e-6)


def test_gloo_ring_refusals():
    import softdot.distributed as sd

    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="not both"):
        sd.ring_attention(object(), q, q, q, seq_len=4, group=object())
    with pytest.raises(NotImplementedError, match="deterministic"):
        sd.ring_attention(None, q, q, q, seq_len=4, group=object(), deterministic=True)


def _mpi_h_layout(n, P, zig, det, r):
    """(rows, chunk, rank r's positions) by mpi.h's formula for ring_layout,
    written out: chunk = ceil(n / (P * chunks per rank)), a multiple of 64
    when deterministic, at least 1; zigzag: chunks r and 2P - 1 - r."""
    per = 2 if zig else 1
    chunk = max(1, -(-n // (P * per)))
    if det:
        chunk = -(-chunk // 64) * 64
    starts = [r * chunk] + ([(2 * P - 1 - r) * chunk] if zig else [])
    return per * chunk, chunk, [s + i for s in starts for i in range(chunk)]


def test_the_core_layout_is_the_mpi_layout():
    """softdot.distributed.ring_layout (what the MPI ring's callers shard
    with) reads the core's ring_layout, with or without MPI: mpi.h's
    formula for every (seq_len, P, layout, deterministic)."""
    import softdot.distributed as sd

    for n in (1, 7, 64, 100, 1000):
        for P in (1, 2, 3, 8):
            for zig in (False, True):
                for det in (False, True):
                    L = sd.ring_layout(
                        n, P, layout="zigzag" if zig else "contiguous", deterministic=det
                    )
                    for r in range(P):
                        rows, chunk, pos = _mpi_h_layout(n, P, zig, det, r)
                        assert (rows, chunk) == (L.rows, L.chunk)
                        assert L.positions(r).tolist() == pos, (n, P, zig, det, r)


def test_the_gloo_ring_layout_is_the_mpi_ring_layout():
    """The gloo ring's rows and the pieces it computes are the MPI ring's
    layout (ring_layout, not deterministic) for several (seq_len, P,
    layout): each piece is a run of real positions of one chunk, and the
    pieces cover exactly the rank's real positions (the MPI ring's rows).
    The causal mask does not enter the layout (only which pairs a ring
    skips), so it is not a case here."""
    import softdot._gloo_ring as G
    import softdot.distributed as sd

    for n in (1, 5, 7, 64, 100, 257):
        for P in (1, 2, 3, 4, 8):
            for layout in ("zigzag", "contiguous"):
                L = sd.ring_layout(n, P, layout=layout)
                for r in range(P):
                    rows, pieces = G.pieces(n, P, layout, r)
                    assert rows == L.rows, (n, P, layout, r)
                    pos = L.positions(r)
                    got = []
                    for row0, pos0, k in pieces:
                        assert k >= 1 and row0 % L.chunk == 0
                        assert pos[row0 : row0 + k].tolist() == list(range(pos0, pos0 + k))
                        got += list(range(row0, row0 + k))
                    assert got == np.nonzero(pos < n)[0].tolist(), (n, P, layout, r)
