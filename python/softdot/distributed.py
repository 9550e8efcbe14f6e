"""softdot.distributed: softdot across MPI processes, for mpi4py users
(docs/python.md, "MPI: softdot.distributed").

Every function is collective over the mpi4py communicator it is given: each
rank calls it with its own shard. The communicator reaches the C++ library
(softdot::mpi, include/softdot/mpi.h) as its Fortran handle
(``comm.py2f()``), which duplicates it for the length of the call, so
softdot's messages never match the caller's. Arguments are checked on every
rank and the verdicts combined before any data moves: a bad shard on one rank
makes every rank raise ``ValueError`` naming the first failing rank, never a
hang.

Needs softdot built where CMake found MPI (Debian: ``libopenmpi-dev``; the
module ``softdot._softdot_mpi``) and mpi4py on the same MPI library.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _int8
from . import _request as R
from . import _softdot as _core
from . import _terms as T
from ._mpi_comm import agreed as _agreed
from ._mpi_comm import at_least as _at_least
from ._mpi_comm import handle as _handle
from ._mpi_comm import mpi as _mpi
from ._vocab_parallel import cross_entropy, linear_cross_entropy, log_softmax, logsumexp, softmax

__all__ = [
    "RingLayout",
    "ring_layout",
    "ring_attention",
    "ring_attention_backward",
    "softmax",
    "log_softmax",
    "logsumexp",
    "cross_entropy",
    "linear_cross_entropy",
]

_LAYOUTS = ("zigzag", "contiguous")


def _layout_name(fn: str, layout: Any) -> bool:
    if layout not in _LAYOUTS:
        raise ValueError(f"{fn}: layout must be 'zigzag' or 'contiguous', not {layout!r}")
    return layout == "zigzag"


class RingLayout:
    """How ``seq_len`` positions are split over ``ranks`` ranks for
    :func:`ring_attention`: every rank holds ``rows`` rows; ``zigzag`` gives
    rank r the chunks r and 2P - 1 - r (balanced causal work),
    ``contiguous`` chunk r. Positions >= seq_len are padding (masked keys,
    zero query rows)."""

    __slots__ = ("seq_len", "ranks", "layout", "deterministic", "rows", "chunk")

    def __init__(self, seq_len: int, ranks: int, layout: str, deterministic: bool):
        zig = _layout_name("ring_layout", layout)
        if int(ranks) < 1 or int(seq_len) < 1:
            raise ValueError(f"ring_layout: seq_len {seq_len} and ranks {ranks} must be >= 1")
        # The core library's layout (softdot/ring_layout.h): the MPI ring's
        # and the torch.distributed ring's, with or without MPI.
        rows, chunk, _ = _core.ring_layout(int(seq_len), int(ranks), zig, bool(deterministic), 0)
        self.seq_len, self.ranks, self.layout = int(seq_len), int(ranks), layout
        self.deterministic, self.rows, self.chunk = bool(deterministic), rows, chunk

    def positions(self, rank: int) -> np.ndarray:
        """The global position of each of rank's rows (int64, ``rows`` of them;
        those >= seq_len are padding)."""
        _, _, pos = _core.ring_layout(
            self.seq_len, self.ranks, self.layout == "zigzag", self.deterministic, int(rank)
        )
        return np.asarray(pos, dtype=np.int64)

    def shard(self, x: Any, rank: int, *, axis: int = -2) -> Any:
        """Rank's rows of a whole-sequence array (``x.shape[axis] == seq_len``),
        padding rows zero: a copy, numpy in numpy out, torch in torch out."""
        kind = A.kind_of(x)
        xa = A.tensor_view("shard", "x", x) if kind == "torch" else np.asarray(x)
        ax = A.normalize_axis("RingLayout.shard", axis, xa.ndim)
        if xa.shape[ax] != self.seq_len:
            raise ValueError(
                f"RingLayout.shard: x has shape {xa.shape}; axis {ax} must have seq_len = "
                f"{self.seq_len} entries"
            )
        pos = self.positions(rank)
        keep = pos < self.seq_len
        shape = list(xa.shape)
        shape[ax] = self.rows
        r = np.zeros(shape, dtype=xa.dtype)
        idx: list = [slice(None)] * xa.ndim
        idx[ax] = np.nonzero(keep)[0]
        r[tuple(idx)] = np.take(xa, pos[keep], axis=ax)
        if kind == "torch":
            return A.torch_module().from_numpy(r)
        return r

    def __repr__(self) -> str:
        return (
            f"RingLayout(seq_len={self.seq_len}, ranks={self.ranks}, layout={self.layout!r}, "
            f"deterministic={self.deterministic}, rows={self.rows}, chunk={self.chunk})"
        )


def ring_layout(
    seq_len: int, ranks: int, *, layout: str = "zigzag", deterministic: bool = False
) -> RingLayout:
    """The layout :func:`ring_attention` expects for these arguments (C++
    ``softdot::mpi::ring_layout``)."""
    return RingLayout(seq_len, ranks, layout, deterministic)


def ring_attention(
    comm: Any,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    *,
    seq_len: int,
    layout: str = "zigzag",
    deterministic: bool = False,
    bias: Any = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    precise: bool = False,
    return_lse: bool = False,
    out: Any = None,
    group: Any = None,
) -> Any:
    """Ring attention (sequence parallelism) over an mpi4py communicator, or
    over a torch.distributed process group (``comm=None, group=pg``).

    Collective: every rank passes the queries, keys and values of its own
    positions, ``ring_layout(seq_len, comm.Get_size(), layout=layout,
    deterministic=deterministic).positions(rank)`` (padding rows included:
    :meth:`RingLayout.shard` cuts them from whole arrays), and gets the output
    rows of its queries. K/V shards travel around the ring (nonblocking sends
    and receives posted before the compute on the shard in hand); partial
    results are merged unrounded and finalised once.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    query : array [..., Hq, rows, E], float32
    key, value : arrays [..., Hkv, rows, E] / [..., Hkv, rows, Ev]: float32,
        float16, bfloat16, or int8 ``(values, scales)`` pairs, as for
        :func:`softdot.scaled_dot_product_attention` (GQA: Hq a multiple of Hkv).
    attn_mask, bias : broadcastable to [..., Hq, rows, seq_len], optional
        One row per local query row, one column per *global* key position
        (bool attn_mask: True = attend; a float attn_mask or bias is added).
    seq_len : int
        The whole sequence's length.
    layout : {"zigzag", "contiguous"}
    deterministic : bool
        True: bitwise the same result for every number of ranks (the partials
        of fixed 64-key blocks merged in global key order); False: the same
        bits run to run for a given number of ranks, and with one rank
        bitwise the one-process attention.
    scale, causal, window, softcap, sinks, alibi_slopes, precise :
        As for :func:`softdot.scaled_dot_product_attention`, over global
        positions (ALiBi's distances are those of the global positions).
        Every rank must pass the same options: the ring compares them all
        (the slopes' and sinks' values included) and raises ValueError on
        every rank where one differs.
    return_lse : bool
    out : array [..., Hq, rows, Ev], float32, optional

    group : torch.distributed process group, optional
        With ``comm=None``: the ring over torch.distributed point-to-point
        sends (gloo on CPU), no mpi4py or MPI build needed; float32 torch
        tensors [B, H, rows, E]; forward and backward (autograd); the parts
        merged in float64 and rounded once; not ``deterministic``,
        ``precise`` or ``out=``.

    On torch tensors that require grad (query, key, value, sinks) the call
    is a ``torch.autograd.Function`` whose backward is
    :func:`ring_attention_backward` (collective: every rank runs its
    backward, as in data- or sequence-parallel training); the lse of
    ``return_lse`` is differentiable too. A mask or bias that requires grad
    raises NotImplementedError.

    Returns
    -------
    out, or (out, lse): each row what the one-process attention gives for
    that query against the whole sequence, within its bound; padding rows
    +0 with lse -inf. Special values as in one process.
    """
    fn = "ring_attention"
    extras = (attn_mask, bias, sinks, alibi_slopes)
    flags: Dict[str, Any] = dict(scale=scale, causal=causal, window=window, softcap=softcap)
    if group is not None:
        _group_call(fn, comm, layout, deterministic, precise, out)
        from . import _gloo_ring

        return _gloo_ring.ring_attention(
            fn, group, (query, key, value), extras, seq_len, layout, flags, return_lse
        )
    h, zig, n = _ring_args(fn, comm, layout, seq_len)
    flags["precise"] = precise
    if A.kind_of(query) == "torch" and _wants_grad(
        query, key, value, sinks, attn_mask, bias, alibi_slopes
    ):
        spec = dict(flags, seq_len=n, layout=layout, deterministic=deterministic)
        return _with_grad(fn, comm, (query, key, value), extras, out, return_lse, spec)
    R.no_grad(fn, A.kind_of(query), query, key, value, attn_mask, bias, sinks, alibi_slopes)
    p = R.prepare(fn, query, key, value)
    if p.q_format != R.KV_F32:
        raise TypeError(
            f"{fn}: query has dtype {R.KV_NAMES[p.q_format]}; ring_attention takes a float32 query"
        )
    mask, bias4, sinks1, opts = _ring_options(fn, p.kind, p.lead + (p.L,), n, extras, flags)
    shape = p.lead + (p.L, p.Ev)
    user, o = A.output(fn, out, shape, A.F32, p.kind)
    if out is not None:
        inputs = [("attn_mask", mask), ("bias", bias4), ("sinks", sinks1)]
        R.check_out_overlap(fn, o, p.raw + inputs)
    target, direct = R.target(o)
    lse_user, lse = A.new_output(p.lead + (p.L,), A.F32, p.kind) if return_lse else (None, None)

    def call() -> None:
        T.run_in(
            lambda: R.terms(p),
            lambda: _mpi.ring_attention(
                h, p.q, p.kv, target, lse, opts, n, zig, bool(deterministic)
            ),
        )

    if p.scales:
        _int8.check_scales_on_error(fn, p.scales, call)
    else:
        call()
    if not direct:
        np.copyto(o, target.reshape(shape))
    return (user, lse_user) if return_lse else user


def _group_call(
    fn: str, comm: Any, layout: Any, deterministic: bool, precise: bool, out: Any
) -> None:
    """The checks of ring_attention over a torch.distributed group (group=)."""
    if comm is not None:
        raise ValueError(f"{fn}: pass comm (mpi4py) or group (torch.distributed), not both")
    _layout_name(fn, layout)
    if deterministic or precise or out is not None:
        raise NotImplementedError(
            f"{fn}: with group=, deterministic, precise and out= are not offered "
            f"(the mpi4py ring has them)"
        )


def _ring_args(fn: str, comm: Any, layout: Any, seq_len: Any) -> Tuple[int, bool, int]:
    """(comm's handle, whether the layout is zigzag, seq_len as an int >= 1)."""
    h = _handle(fn, comm)
    zig = _layout_name(fn, layout)
    return h, zig, _at_least(fn, "seq_len", seq_len, 1)


def _ring_options(
    fn: str,
    kind: str,
    rows: Tuple[int, ...],
    n: int,
    extras: Tuple[Any, ...],
    flags: Dict[str, Any],
) -> Tuple[Any, Any, Any, Dict[str, Any]]:
    """R.mask_options for rows, the query's batch axes and the rank's rows,
    against the n global key positions; extras, (attn_mask, bias, sinks,
    alibi_slopes); flags, R.options's other keywords."""
    attn_mask, bias, sinks, alibi_slopes = extras
    what = "query's batch axes, the rank's rows, seq_len"
    full = rows + (n,)
    return R.mask_options(
        fn, kind, attn_mask, bias, sinks, full, what, alibi_slopes=alibi_slopes, **flags
    )


def _with_grad(
    fn: str,
    comm: Any,
    qkv: Tuple[Any, Any, Any],
    extras: Tuple[Any, ...],
    out: Any,
    return_lse: bool,
    spec: Dict[str, Any],
) -> Any:
    """ring_attention through its autograd Function (_ring_function), on
    torch tensors that require grad; spec: its options."""
    attn_mask, bias, sinks, alibi_slopes = extras
    for name, t in (("attn_mask", attn_mask), ("bias", bias), ("alibi_slopes", alibi_slopes)):
        if getattr(t, "requires_grad", False):
            raise NotImplementedError(
                f"{fn}: {name} requires grad; the ring's backward gives query, key, value "
                f"and sinks gradients (pass it detached)"
            )
    if out is not None:
        raise ValueError(f"{fn}: out= cannot be used on inputs that require grad")
    spec = dict(spec, comm=comm, attn_mask=attn_mask, bias=bias, alibi_slopes=alibi_slopes)
    o, lse_t = _ring_function().apply(*qkv, sinks, spec)
    return (o, lse_t) if return_lse else o


def _wants_grad(*tensors: Any) -> bool:
    torch = A.torch_module()
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


_RING_FUNCTION: Any = None


def _ring_function() -> Any:
    """ring_attention as a torch.autograd.Function (built on first use, so
    that numpy users never import torch): the forward saves out and lse, the
    backward is ring_attention_backward, collective like the forward (every
    rank calls backward on its rows, as torch.distributed training does)."""
    global _RING_FUNCTION
    if _RING_FUNCTION is not None:
        return _RING_FUNCTION
    torch = A.torch_module()
    function: Any = torch.autograd.Function
    from ._autograd import first_order

    class RingAttention(function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, sinks: Any, spec: Any) -> Any:
            kw = dict(spec)
            comm = kw.pop("comm")
            o, lse = ring_attention(
                comm,
                q.detach(),
                k.detach(),
                v.detach(),
                kw.pop("attn_mask"),
                sinks=None if sinks is None else sinks.detach(),
                return_lse=True,
                **kw,
            )
            ctx.save_for_backward(q, k, v, o, lse, sinks)
            ctx.spec = spec
            return o, lse

        @staticmethod
        @first_order("distributed.ring_attention")
        def backward(ctx: Any, dout: Any, dlse: Any) -> Any:
            # No second derivative: differentiating these gradients raises.
            q, k, v, o, lse, sinks = ctx.saved_tensors
            kw = dict(ctx.spec)
            comm = kw.pop("comm")
            kw.pop("precise")
            if dout is None:
                dout = torch.zeros_like(o)
            grads = ring_attention_backward(
                comm,
                q.detach(),
                k.detach(),
                v.detach(),
                o,
                lse,
                dout.contiguous(),
                kw.pop("attn_mask"),
                sinks=None if sinks is None else sinks.detach(),
                grad_lse=None if dlse is None else dlse.contiguous(),
                **kw,
            )
            dsinks = grads[3] if len(grads) == 4 else None
            return grads[0], grads[1], grads[2], dsinks, None

    _RING_FUNCTION = RingAttention
    return RingAttention


def ring_attention_backward(
    comm: Any,
    query: Any,
    key: Any,
    value: Any,
    out: Any,
    lse: Any,
    grad_out: Any,
    attn_mask: Any = None,
    *,
    seq_len: int,
    layout: str = "zigzag",
    deterministic: bool = False,
    bias: Any = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    alibi_slopes: Any = None,
    grad_lse: Any = None,
) -> Any:
    """The backward of :func:`ring_attention` over an mpi4py communicator
    (C++ ``softdot::mpi::ring_attention_backward``).

    Collective: every rank passes what it passed to :func:`ring_attention`
    (its rows of query, key and value, the same options, layout and
    ``deterministic``), that call's ``out`` and ``lse`` (``return_lse=True``)
    and ``grad_out``, the gradient of the loss with respect to ``out``
    (optionally ``grad_lse``, with respect to ``lse``). K/V shards travel the
    ring as in the forward; the double dK / dV sums of each shard travel with
    it and come home after a full turn, and every gradient is rounded once.

    All arrays float32 (numpy, or CPU torch tensors: they are read without
    autograd), shapes as for :func:`ring_attention`; ``lse`` has the query's
    shape without its last axis.

    Returns
    -------
    (dq, dk, dv), and dsinks (one per query head, the whole sequence's,
    the same on every rank) when ``sinks`` is given: this rank's rows of the
    gradients (padding rows 0), each what the one-process attention backward
    gives for the whole sequence within its bound. ``deterministic=True``:
    bitwise the same for every number of ranks (fixed 64 x 64 block pairs
    summed by binary trees over the block indices); False: the same bits run
    to run for a given number of ranks.
    """
    fn = "ring_attention_backward"
    h, zig, n = _ring_args(fn, comm, layout, seq_len)
    arrays = (query, key, value, out, lse, grad_out, grad_lse)
    extras = (attn_mask, bias, sinks, alibi_slopes)
    flags: Dict[str, Any] = dict(scale=scale, causal=causal, window=window, softcap=softcap)
    # The checks here are local: the ranks agree on them (the first failing
    # rank's error raised on every rank) before the library's collective.
    b = _agreed(comm, fn, lambda: _backward_inputs(fn, n, arrays, extras, flags))
    p, kind = b.p, b.p.kind
    dq_user, dq = A.new_output(p.lead + (p.L, p.q.shape[-1]), A.F32, kind)
    dk_user, dk = A.new_output(b.k_shape, A.F32, kind)
    dv_user, dv = A.new_output(b.v_shape, A.F32, kind)
    ds_user = ds = None
    if b.sinks is not None:
        ds_user, ds = A.new_output((b.sinks.shape[0],), A.F32, kind)
    ins = (p.q, p.kv["k"], p.kv["v"], b.out, b.lse, b.grad_out)
    grads = (R.to4(dq), R.to4(dk), R.to4(dv), ds)
    T.run_in(
        lambda: R.terms(p),
        lambda: _mpi.ring_attention_backward(
            h, *ins, *grads, b.grad_lse, b.opts, n, zig, bool(deterministic)
        ),
    )
    if ds_user is not None:
        return dq_user, dk_user, dv_user, ds_user
    return dq_user, dk_user, dv_user


def _plain(x: Any) -> Any:
    return x.detach() if A.is_torch(x) else x


class _Backward(NamedTuple):
    """ring_attention_backward's inputs as the library reads them."""

    p: R.Prepared
    out: np.ndarray
    lse: np.ndarray
    grad_out: np.ndarray
    grad_lse: Optional[np.ndarray]
    sinks: Optional[np.ndarray]
    opts: Dict[str, Any]
    k_shape: Tuple[int, ...]
    v_shape: Tuple[int, ...]


def _backward_inputs(
    fn: str, n: int, arrays: Tuple[Any, ...], extras: Tuple[Any, ...], flags: Dict[str, Any]
) -> _Backward:
    """ring_attention_backward's arrays (query, key, value, out, lse,
    grad_out, grad_lse) and extras (attn_mask, bias, sinks, alibi_slopes)
    checked, torch tensors read without autograd."""
    q_, k_, v_, o_, l_, g_ = map(_plain, arrays[:6])
    grad_lse = arrays[6]
    p = R.prepare(fn, q_, k_, v_)
    if p.q_format != R.KV_F32 or p.kv["format"] != R.KV_F32:
        raise TypeError(f"{fn}: query, key and value must be float32")
    kq = p.kind

    def f32(name: str, x: Any, shape: Tuple[int, ...]) -> np.ndarray:
        a = R.as_numpy(fn, name, R.array(fn, name, _plain(x), kq), kq)
        if a.dtype != A.F32:
            raise TypeError(f"{fn}: {name} has dtype {a.dtype.name}; expected float32")
        if a.shape != shape:
            raise ValueError(f"{fn}: {name} has shape {a.shape}; expected {shape}")
        return a

    oshape = p.lead + (p.L, p.Ev)
    o4 = R.ready(R.to4(f32("out", o_, oshape)))
    do4 = R.ready(R.to4(f32("grad_out", g_, oshape)))
    lse_a = np.ascontiguousarray(f32("lse", l_, p.lead + (p.L,)))
    dlse_a = None
    if grad_lse is not None:
        dlse_a = np.ascontiguousarray(f32("grad_lse", grad_lse, p.lead + (p.L,)))
    plain_extras = tuple(map(_plain, extras))
    _, _, sinks1, opts = _ring_options(fn, kq, p.lead + (p.L,), n, plain_extras, flags)
    return _Backward(p, o4, lse_a, do4, dlse_a, sinks1, opts, tuple(k_.shape), tuple(v_.shape))
