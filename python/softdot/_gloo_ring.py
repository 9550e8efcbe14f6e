"""Ring attention over a torch.distributed process group (gloo, or any
backend with point-to-point send and receive of CPU tensors), forward and
backward, for PyTorch users without mpi4py: softdot.distributed.ring_attention
(..., group=pg). The layout is the MPI ring's, read from the core library
(softdot/ring_layout.h, zigzag or contiguous chunks); each step is one
attention request (forward: kind "partial", the unrounded partial result;
backward: kind "gradients", with the whole sequence's out and lse) on the
query chunks against the visiting key chunk, with global positions, and the
K/V shard moves to the next rank (isend / irecv posted before the compute).
The forward merges the steps' partial results with the core's rule
(AttentionPartial.merge, in double, as the MPI ring does) and rounds once
(finalize); the backward sums each step's float32 gradients in float64 and
rounds once to float32 at the end: within attention()'s bound plus one float
rounding per step. Not deterministic across group sizes (the MPI ring's
deterministic mode is not offered here)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import _request as R
from . import _softdot as _core
from ._autograd import first_order


def pieces(
    seq_len: int, ranks: int, layout: str, rank: int
) -> Tuple[int, List[Tuple[int, int, int]]]:
    """(rows per rank, [(first local row, first global position, real rows)]
    of the rank's chunks that hold real positions, < seq_len): the core's
    ring_layout (softdot/ring_layout.h), the MPI ring's, without its
    deterministic rounding."""
    rows, chunk, pos = _core.ring_layout(seq_len, ranks, layout == "zigzag", False, rank)
    out = []
    for row0 in range(0, rows, chunk):
        n = min(chunk, seq_len - pos[row0])
        if n > 0:
            out.append((row0, pos[row0], n))
    return rows, out


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


class _Ring:
    """One call's fixed pieces: the group, the layout, the options (spec:
    R.options's scale, causal, window, softcap and alibi_slopes)."""

    def __init__(self, fn: str, group: Any, seq_len: int, layout: str, spec: Dict[str, Any]):
        self.fn, self.group, self.n, self.layout = fn, group, seq_len, layout
        self.P = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.rows = pieces(seq_len, self.P, layout, self.rank)[0]
        self.spec = spec

    def pieces(self, owner: int) -> List[Tuple[int, int, int]]:
        """(first local row, first position, rows) of owner's chunks that hold
        real positions (< seq_len)."""
        return pieces(self.n, self.P, self.layout, owner)[1]

    def options(
        self, mask4: Any, bias4: Any, q0: int, qn: int, qpos: int, kpos: int, sinks: Any
    ) -> Dict[str, Any]:
        o = R.options(
            self.fn,
            mask=None if mask4 is None else mask4[:, :, q0 : q0 + qn],
            bias=None if bias4 is None else bias4[:, :, q0 : q0 + qn],
            sinks=sinks,
            **self.spec,
        )
        o["q_position"], o["kv_position"] = qpos, kpos
        return o

    def exchange(self, tensors: List[torch.Tensor]) -> Tuple[List[torch.Tensor], List[Any]]:
        """Posts the send of tensors to rank + 1 and the receive of their
        likes from rank - 1; returns (receive buffers, requests)."""
        nxt, prv = (self.rank + 1) % self.P, (self.rank - 1) % self.P
        bufs = [torch.empty_like(t) for t in tensors]
        reqs = []
        for i, (t, b) in enumerate(zip(tensors, bufs)):
            # Even ranks send first, odd ranks receive first: no rank waits on
            # a send its neighbour has not received yet. One tag per tensor.
            if self.rank % 2 == 0:
                reqs.append(dist.isend(t, nxt, group=self.group, tag=i))
                reqs.append(dist.irecv(b, prv, group=self.group, tag=i))
            else:
                reqs.append(dist.irecv(b, prv, group=self.group, tag=i))
                reqs.append(dist.isend(t, nxt, group=self.group, tag=i))
        return bufs, reqs


def _check_same(ring: _Ring, q: Any, k: Any, v: Any, masks: Any, sinks: Any) -> None:
    """Collective: every rank must pass the same shapes and options (the
    sinks' and ALiBi slopes' values included: softdot.option_fingerprint,
    which the MPI rings compare too); ValueError on every rank naming the
    first that differs."""
    sinks1 = None if sinks is None else np.ascontiguousarray(_np(sinks), dtype=np.float32)
    o = R.options(ring.fn, sinks=sinks1, **ring.spec)
    fields = [
        ("query.shape", hash(tuple(q.shape))),
        ("key.shape", hash(tuple(k.shape))),
        ("value.shape", hash(tuple(v.shape))),
        ("seq_len", ring.n),
        ("layout", 0 if ring.layout == "zigzag" else 1),
        ("attn_mask", int(masks[0] is not None)),
        ("bias", int(masks[1] is not None)),
    ]
    fields += [(f"options.{n}", v) for n, v in _core.option_fingerprint(o)]
    vals = [int(x) for _, x in fields]
    t = torch.tensor(vals + [~x for x in vals], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ring.group)
    n = len(fields)
    for i, (name, _) in enumerate(fields):
        if int(t[i]) != ~int(t[n + i]):
            raise ValueError(
                f"{ring.fn}: {name} differs between ranks (every rank must pass the same "
                f"shapes and options)"
            )


def _masks(ring: _Ring, q4: torch.Tensor, attn_mask: Any, bias: Any) -> Tuple[Any, Any]:
    B, H, L, _ = q4.shape
    lead = (B, H)
    return R.masks(
        ring.fn, attn_mask, bias, "torch", lead + (L, ring.n), "batch, heads, rows, seq_len"
    )


def forward(
    ring: _Ring,
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    attn_mask: Any,
    bias: Any,
    sinks: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """out [B, H, rows, Ev] and lse [B, H, rows] (float32; padding rows 0
    and -inf)."""
    B, H, L, _ = q4.shape
    Ev = v4.shape[-1]
    mask4, bias4 = _masks(ring, q4, attn_mask, bias)
    sinks1 = None if sinks is None else np.ascontiguousarray(_np(sinks), dtype=np.float32)
    kv = [k4.contiguous(), v4.contiguous()]
    qp = ring.pieces(ring.rank)
    # One running partial per query chunk; `part` is each step's (the
    # request resizes it).
    acc = [_core.AttentionPartial.empty(B, H, qn, Ev) for _, _, qn in qp]
    part = _core.AttentionPartial.empty(B, H, 0, Ev)
    for step in range(ring.P):
        owner = (ring.rank - step) % ring.P
        reqs: List[Any] = []
        nxt = None
        if step + 1 < ring.P:
            nxt, reqs = ring.exchange(kv)
        for (q0, qpos, qn), a in zip(qp, acc):
            for ki, (k0, kpos, kn) in enumerate(ring.pieces(owner)):
                first = step == 0 and ki == 0
                o = ring.options(mask4, bias4, q0, qn, qpos, kpos, sinks1 if first else None)
                kvd = {
                    "format": R.KV_F32,
                    "k": _np(kv[0][:, :, k0 : k0 + kn]),
                    "v": _np(kv[1][:, :, k0 : k0 + kn]),
                }
                q = _np(q4[:, :, q0 : q0 + qn])
                R.run(ring.fn, q, kvd, "partial", None, None, o, [], partial=part)
                a.merge(part)
        for r in reqs:
            r.wait()
        if nxt is not None:
            kv = nxt
    out = np.zeros((B, H, L, Ev), np.float32)
    lse = np.full((B, H, L), -np.inf, np.float32)
    for (q0, _, qn), a in zip(qp, acc):
        lse_c = np.empty((B, H, qn), np.float32)
        a.finalize(out[:, :, q0 : q0 + qn], lse_c.reshape(-1))
        lse[:, :, q0 : q0 + qn] = lse_c
    return torch.from_numpy(out), torch.from_numpy(lse)


def backward(
    ring: _Ring,
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    out4: torch.Tensor,
    lse: torch.Tensor,
    dout4: torch.Tensor,
    dlse: Optional[torch.Tensor],
    attn_mask: Any,
    bias: Any,
    sinks: Any,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    B, H, L, E = q4.shape
    Hk, Ev = k4.shape[1], v4.shape[-1]
    mask4, bias4 = _masks(ring, q4, attn_mask, bias)
    sinks1 = None if sinks is None else np.ascontiguousarray(_np(sinks), dtype=np.float32)
    dq = np.zeros((B, H, L, E))
    ds = np.zeros(H) if sinks1 is not None else None
    # The visiting shard and its gradients' float64 sums travel together.
    travel = [
        k4.contiguous(),
        v4.contiguous(),
        torch.zeros(B, Hk, L, E, dtype=torch.float64),
        torch.zeros(B, Hk, L, Ev, dtype=torch.float64),
    ]
    qp = ring.pieces(ring.rank)
    lse_n, out_n, dout_n = _np(lse), _np(out4), _np(dout4)
    dlse_n = None if dlse is None else np.ascontiguousarray(_np(dlse), dtype=np.float32)
    for step in range(ring.P):
        owner = (ring.rank - step) % ring.P
        dk_acc, dv_acc = _np(travel[2]), _np(travel[3])
        for q0, qpos, qn in qp:
            for ki, (k0, kpos, kn) in enumerate(ring.pieces(owner)):
                first = step == 0 and ki == 0
                o = ring.options(mask4, bias4, q0, qn, qpos, kpos, sinks1 if first else None)
                gq = np.empty((B, H, qn, E), np.float32)
                gk = np.empty((B, Hk, kn, E), np.float32)
                gv = np.empty((B, Hk, kn, Ev), np.float32)
                gs = np.empty(H, np.float32) if first and sinks1 is not None else None
                sl = np.s_[:, :, q0 : q0 + qn]
                io = {
                    "out": np.ascontiguousarray(out_n[sl]),
                    "lse": np.ascontiguousarray(lse_n[sl]).reshape(-1),
                    "dout": np.ascontiguousarray(dout_n[sl]),
                    "dlse": None
                    if dlse_n is None
                    else np.ascontiguousarray(dlse_n[sl]).reshape(-1),
                    "dq": gq,
                    "dk": gk,
                    "dv": gv,
                    "dsinks": gs,
                }
                kvd = {
                    "format": R.KV_F32,
                    "k": _np(travel[0][:, :, k0 : k0 + kn]),
                    "v": _np(travel[1][:, :, k0 : k0 + kn]),
                }
                R.run(ring.fn, _np(q4[sl]), kvd, "gradients", None, None, o, [], backward=io)
                dq[sl] += gq
                dk_acc[:, :, k0 : k0 + kn] += gk
                dv_acc[:, :, k0 : k0 + kn] += gv
                if gs is not None and ds is not None:
                    ds += gs
        # Pass the shard and its sums on; after P steps they are home (one
        # rank: they already are, and gloo cannot send to itself).
        if ring.P > 1:
            nxt, reqs = ring.exchange(travel)
            for r in reqs:
                r.wait()
            travel = nxt
    dsinks = None
    if ds is not None:
        t = torch.from_numpy(ds)
        dist.all_reduce(t, group=ring.group)
        dsinks = t.float()
    return (
        torch.from_numpy(dq.astype(np.float32)),
        travel[2].float(),
        travel[3].float(),
        dsinks,
    )


class RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, sinks: Any, ring: Any, masks: Any) -> Any:
        q4, k4, v4 = (t.detach() for t in (q, k, v))
        out, lse = forward(
            ring, q4, k4, v4, masks[0], masks[1], None if sinks is None else sinks.detach()
        )
        ctx.save_for_backward(q4, k4, v4, out, lse, sinks)
        ctx.ring, ctx.masks = ring, masks
        return out, lse

    @staticmethod
    @first_order("distributed.ring_attention")
    def backward(ctx: Any, dout: Any, dlse: Any) -> Any:
        # No second derivative: differentiating these gradients raises.
        q4, k4, v4, out, lse, sinks = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, ds = backward(
            ctx.ring,
            q4,
            k4,
            v4,
            out,
            lse,
            dout.contiguous().float(),
            dlse,
            ctx.masks[0],
            ctx.masks[1],
            None if sinks is None else sinks.detach(),
        )
        return dq, dk, dv, ds, None, None


def ring_attention(
    fn: str,
    group: Any,
    qkv: Tuple[Any, Any, Any],
    extras: Tuple[Any, Any, Any, Any],
    seq_len: int,
    layout: str,
    flags: Dict[str, Any],
    return_lse: bool,
) -> Any:
    """softdot.distributed.ring_attention(..., group=): qkv, (query, key,
    value); extras, (attn_mask, bias, sinks, alibi_slopes); flags, the
    scale, causal, window and softcap options."""
    query, key, value = qkv
    attn_mask, bias, sinks, alibi_slopes = extras
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 4:
            raise TypeError(
                f"{fn}: with group=, {name} must be a float32 torch tensor [B, H, rows, E]"
            )
    for name, t in (("attn_mask", attn_mask), ("bias", bias), ("alibi_slopes", alibi_slopes)):
        if getattr(t, "requires_grad", False):
            raise NotImplementedError(
                f"{fn}: {name} requires grad; the ring gives no gradient for it"
            )
    if not dist.is_initialized():
        raise RuntimeError(f"{fn}: torch.distributed is not initialized (init_process_group first)")
    slopes = R.sinks_array(fn, alibi_slopes, "torch", "alibi_slopes", "slope")
    spec = dict(flags, alibi_slopes=slopes)
    if int(seq_len) < 1:
        raise ValueError(f"{fn}: seq_len must be >= 1, got {seq_len}")
    ring = _Ring(fn, group, int(seq_len), layout, spec)
    if query.shape[2] != ring.rows or key.shape[2] != ring.rows or value.shape[2] != ring.rows:
        raise ValueError(
            f"{fn}: query {tuple(query.shape)}, key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}: every rank holds {ring.rows} rows "
            f"(seq_len {seq_len} over {ring.P} ranks, {layout})"
        )
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
    masks = (
        None
        if attn_mask is None
        else (attn_mask.detach() if isinstance(attn_mask, torch.Tensor) else attn_mask),
        None if bias is None else (bias.detach() if isinstance(bias, torch.Tensor) else bias),
    )
    _check_same(ring, query, key, value, masks, sinks)
    grad = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (query, key, value, sinks)
    )
    if grad:
        out, lse = RingFunction.apply(query, key, value, sinks, ring, masks)
    else:
        out, lse = forward(
            ring, query.detach(), key.detach(), value.detach(), masks[0], masks[1], sinks
        )
    return (out, lse) if return_lse else out


__all__ = ["ring_attention", "pieces"]
