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

from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _cross_entropy as _xent
from . import _int8
from . import _request as R

_MPI_MISSING = (
    "softdot.distributed needs softdot built with MPI for mpi4py communicators (the module "
    "softdot._softdot_mpi is missing): install an MPI (Debian: apt-get install "
    "libopenmpi-dev openmpi-bin), reinstall softdot (pip install .), and "
    "pip install mpi4py; or pass a torch.distributed process group (group=)"
)
try:
    from . import _softdot_mpi as _mpi_module
except ImportError:  # pragma: no cover - depends on the build
    _mpi_module = None


class _NeedMPI:
    """Stands for the MPI module where the build has none: any use raises
    ImportError saying what to install (the torch.distributed path of
    ring_attention needs no MPI)."""

    def __getattr__(self, name: str) -> Any:
        raise ImportError(_MPI_MISSING)


_mpi: Any = _mpi_module if _mpi_module is not None else _NeedMPI()


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


def _python_layout(
    seq_len: int, ranks: int, zig: bool, deterministic: bool, rank: int
) -> Tuple[int, int, np.ndarray]:
    """(rows, chunk, rank's positions): softdot::mpi::ring_layout's formula
    (mpi.h), for builds without MPI (tests compare the two)."""
    per = 2 if zig else 1
    chunk = max(1, -(-seq_len // (ranks * per)))
    if deterministic:
        chunk = -(-chunk // 64) * 64
    first = np.arange(chunk, dtype=np.int64) + rank * chunk
    if zig:
        second = np.arange(chunk, dtype=np.int64) + (2 * ranks - 1 - rank) * chunk
        first = np.concatenate([first, second])
    return per * chunk, chunk, first


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
        if _mpi_module is not None:
            rows, chunk, _ = _mpi.ring_layout(int(seq_len), int(ranks), zig, bool(deterministic), 0)
        else:  # the same formula, for torch.distributed users
            rows, chunk, _ = _python_layout(int(seq_len), int(ranks), zig, bool(deterministic), 0)
        self.seq_len, self.ranks, self.layout = int(seq_len), int(ranks), layout
        self.deterministic, self.rows, self.chunk = bool(deterministic), rows, chunk

    def positions(self, rank: int) -> np.ndarray:
        """The global position of each of rank's rows (int64, ``rows`` of them;
        those >= seq_len are padding)."""
        if _mpi_module is None:
            zig = self.layout == "zigzag"
            return _python_layout(self.seq_len, self.ranks, zig, self.deterministic, rank)[2]
        _, _, pos = _mpi.ring_layout(
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


def _handle(fn: str, comm: Any) -> int:
    """comm's Fortran handle; ImportError first where softdot has no MPI."""
    if _mpi_module is None:
        raise ImportError(_MPI_MISSING)
    f = getattr(comm, "py2f", None)
    if f is None:
        raise TypeError(
            f"{fn}: comm must be an mpi4py communicator (with py2f()), not {type(comm).__name__}"
        )
    return int(f())


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
    if group is not None:
        if comm is not None:
            raise ValueError(f"{fn}: pass comm (mpi4py) or group (torch.distributed), not both")
        _layout_name(fn, layout)
        if deterministic or precise or out is not None:
            raise NotImplementedError(
                f"{fn}: with group=, deterministic, precise and out= are not offered "
                f"(the mpi4py ring has them)"
            )
        from . import _gloo_ring

        return _gloo_ring.ring_attention(
            fn,
            group,
            query,
            key,
            value,
            attn_mask,
            bias,
            seq_len,
            layout,
            scale,
            causal,
            window,
            softcap,
            sinks,
            alibi_slopes,
            return_lse,
        )
    h = _handle(fn, comm)
    zig = _layout_name(fn, layout)
    try:
        n = int(seq_len)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: seq_len must be an int, not {seq_len!r}") from None
    if n < 1:
        raise ValueError(f"{fn}: seq_len must be >= 1, got {n}")
    if A.kind_of(query) == "torch" and _wants_grad(
        query, key, value, sinks, attn_mask, bias, alibi_slopes
    ):
        for name, t in (("attn_mask", attn_mask), ("bias", bias), ("alibi_slopes", alibi_slopes)):
            if getattr(t, "requires_grad", False):
                raise NotImplementedError(
                    f"{fn}: {name} requires grad; the ring's backward gives query, key, value "
                    f"and sinks gradients (pass it detached)"
                )
        if out is not None:
            raise ValueError(f"{fn}: out= cannot be used on inputs that require grad")
        spec = dict(
            comm=comm,
            attn_mask=attn_mask,
            bias=bias,
            seq_len=n,
            layout=layout,
            deterministic=deterministic,
            scale=scale,
            causal=causal,
            window=window,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            precise=precise,
        )
        o, lse_t = _ring_function().apply(query, key, value, sinks, spec)
        return (o, lse_t) if return_lse else o
    R.no_grad(fn, A.kind_of(query), query, key, value, attn_mask, bias, sinks, alibi_slopes)
    p = R.prepare(fn, query, key, value)
    if p.q_format != R.KV_F32:
        raise TypeError(
            f"{fn}: query has dtype {R.KV_NAMES[p.q_format]}; ring_attention takes a float32 query"
        )
    mask, bias4 = R.masks(
        fn,
        attn_mask,
        bias,
        p.kind,
        p.lead + (p.L, n),
        "query's batch axes, the rank's rows, seq_len",
    )
    sinks1 = R.sinks_array(fn, sinks, p.kind)
    opts = R.options(
        fn,
        scale=scale,
        causal=causal,
        window=window,
        softcap=softcap,
        precise=precise,
        mask=mask,
        bias=bias4,
        sinks=sinks1,
        alibi_slopes=R.sinks_array(fn, alibi_slopes, p.kind, "alibi_slopes", "slope"),
    )
    shape = p.lead + (p.L, p.Ev)
    user, o = A.output(fn, out, shape, A.F32, p.kind)
    if out is not None:
        R.check_out_overlap(
            fn, o, p.raw + [("attn_mask", mask), ("bias", bias4), ("sinks", sinks1)]
        )
    target, direct = R.target(o)
    lse_user, lse = A.new_output(p.lead + (p.L,), A.F32, p.kind) if return_lse else (None, None)

    caller = R.terms(p)

    def call() -> None:
        caller.run(
            lambda: _mpi.ring_attention(
                h, p.q, p.kv, target, lse, opts, n, zig, bool(deterministic)
            )
        )

    if p.scales:
        _int8.check_scales_on_error(fn, p.scales, call)
    else:
        call()
    if not direct:
        np.copyto(o, target.reshape(shape))
    return (user, lse_user) if return_lse else user


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


def _agreed(comm: Any, fn: str, prepare: Any) -> Any:
    """prepare() on every rank, then agreement: when it raised TypeError or
    ValueError on some rank, every rank raises that of the lowest such rank,
    prefixed "rank R: " (so that no rank waits in the library's collective
    for a rank that failed before it)."""
    err = None
    res = None
    try:
        res = prepare()
    except (TypeError, ValueError) as e:
        err = (type(e) is TypeError, f"{e}")
    verdicts = comm.allgather(err)
    for r, v in enumerate(verdicts):
        if v is not None:
            raise (TypeError if v[0] else ValueError)(f"rank {r}: {v[1]}")
    return res


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
    h = _handle(fn, comm)
    zig = _layout_name(fn, layout)
    try:
        n = int(seq_len)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: seq_len must be an int, not {seq_len!r}") from None
    if n < 1:
        raise ValueError(f"{fn}: seq_len must be >= 1, got {n}")

    def prepare() -> Tuple[Any, ...]:
        def plain(x: Any) -> Any:
            return x.detach() if A.is_torch(x) else x

        q_, k_, v_, o_, l_, g_ = map(plain, (query, key, value, out, lse, grad_out))
        p = R.prepare(fn, q_, k_, v_)
        if p.q_format != R.KV_F32 or p.kv["format"] != R.KV_F32:
            raise TypeError(f"{fn}: query, key and value must be float32")
        kq = p.kind

        def f32(name: str, x: Any, shape: Tuple[int, ...]) -> np.ndarray:
            a = R.as_numpy(fn, name, R.array(fn, name, plain(x), kq), kq)
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
        mask, bias4 = R.masks(
            fn,
            None if attn_mask is None else plain(attn_mask),
            None if bias is None else plain(bias),
            kq,
            p.lead + (p.L, n),
            "query's batch axes, the rank's rows, seq_len",
        )
        sinks1 = R.sinks_array(fn, None if sinks is None else plain(sinks), kq)
        slopes = None if alibi_slopes is None else plain(alibi_slopes)
        opts = R.options(
            fn,
            scale=scale,
            causal=causal,
            window=window,
            softcap=softcap,
            mask=mask,
            bias=bias4,
            sinks=sinks1,
            alibi_slopes=R.sinks_array(fn, slopes, kq, "alibi_slopes", "slope"),
        )
        return p, kq, o4, do4, lse_a, dlse_a, sinks1, opts, tuple(k_.shape), tuple(v_.shape)

    # The checks here are local: the ranks agree on them (the first failing
    # rank's error raised on every rank) before the library's collective.
    p, kq, o4, do4, lse_a, dlse_a, sinks1, opts, k_shape, v_shape = _agreed(comm, fn, prepare)
    dq_user, dq = A.new_output(p.lead + (p.L, p.q.shape[-1]), A.F32, kq)
    dk_user, dk = A.new_output(k_shape, A.F32, kq)
    dv_user, dv = A.new_output(v_shape, A.F32, kq)
    ds_user = ds = None
    if sinks1 is not None:
        ds_user, ds = A.new_output((sinks1.shape[0],), A.F32, kq)
    R.terms(p).run(
        lambda: _mpi.ring_attention_backward(
            h,
            p.q,
            p.kv["k"],
            p.kv["v"],
            o4,
            lse_a,
            do4,
            R.to4(dq),
            R.to4(dk),
            R.to4(dv),
            ds,
            dlse_a,
            opts,
            n,
            zig,
            bool(deterministic),
        )
    )
    if ds_user is not None:
        return dq_user, dk_user, dv_user, ds_user
    return dq_user, dk_user, dv_user


# ---- vocabulary-parallel: rows whose columns are split across the ranks -------------


def _vocab_begin(fn: str, vocab_begin: Any) -> int:
    """vocab_begin as an int >= 0, else TypeError / ValueError naming fn."""
    try:
        vb = int(vocab_begin)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: vocab_begin must be an int, not {vocab_begin!r}") from None
    if vb < 0:
        raise ValueError(f"{fn}: vocab_begin must be >= 0, got {vb}")
    return vb


def _shard(fn: str, x: Any, vocab_begin: Any):
    """(2-d float rows of x, kind, whether x was one row, vocab_begin)."""
    kind = A.kind_of(x)
    xa = A.float_input(fn, "x", x, kind)
    single = xa.ndim == 1
    if single:
        xa = xa.reshape(1, -1)
    elif xa.ndim != 2:
        raise ValueError(f"{fn}: x has shape {xa.shape}; expected (rows, columns) or (columns,)")
    vb = _vocab_begin(fn, vocab_begin)
    return A.contiguous_rows(xa), kind, single, vb


def _rows_op(fn: str, comm: Any, x: Any, vocab_begin: Any, op: int, deterministic: bool):
    h = _handle(fn, comm)
    xa, kind, single, vb = _agreed(comm, fn, lambda: _shard(fn, x, vocab_begin))
    user, o = A.new_output(xa.shape, xa.dtype, kind)
    _mpi.vocab_rows(h, xa, o, vb, op, bool(deterministic))
    return user.reshape(-1) if single else user


_VOCAB_DOC = """
    Collective over ``comm`` (an mpi4py communicator): every rank passes the
    same rows, its own columns ``[vocab_begin, vocab_begin + columns)`` of
    them; the ranks' ranges must tile ``[0, V)`` (any rank order; a rank may
    hold no column). Each shard's rows are reduced to softmax states, which
    are gathered and merged in vocabulary order (C++
    ``softdot::mpi``, include/softdot/mpi_vocab.h). ``deterministic=True``:
    the same bits for every number of ranks and every split (exact global
    max, sums in 128-bit fixed point). Special values as on one process over
    the whole row; a NaN on any rank makes the row NaN on every rank. x is
    float32 or float64, (rows, columns) or one row (columns,), numpy or a
    CPU torch tensor; never modified."""


def softmax(comm: Any, x: Any, vocab_begin: int, /, *, deterministic: bool = False) -> Any:
    """Softmax over whole rows split by columns across the ranks: this rank's
    columns of the weights, within 1 ulp of the exact weight."""
    return _rows_op("softmax", comm, x, vocab_begin, 0, deterministic)


def log_softmax(comm: Any, x: Any, vocab_begin: int, /, *, deterministic: bool = False) -> Any:
    """Log-softmax over whole rows split by columns: this rank's columns,
    ``(x - M) - log S`` in long double, rounded once."""
    return _rows_op("log_softmax", comm, x, vocab_begin, 1, deterministic)


def logsumexp(comm: Any, x: Any, vocab_begin: int, /, *, deterministic: bool = False) -> Any:
    """logsumexp of each whole row (split by columns across the ranks), the
    same on every rank: shape (rows,), or a scalar for one row."""
    fn = "logsumexp"
    h = _handle(fn, comm)
    xa, kind, single, vb = _agreed(comm, fn, lambda: _shard(fn, x, vocab_begin))
    user, o = A.new_output((xa.shape[0],), xa.dtype, kind)
    _mpi.vocab_logsumexp(h, xa, o, vb, bool(deterministic))
    if single:
        return A.wrap_scalar(float(o[0]), xa.dtype, kind)
    return user


softmax.__doc__ = (softmax.__doc__ or "") + _VOCAB_DOC
log_softmax.__doc__ = (log_softmax.__doc__ or "") + _VOCAB_DOC
logsumexp.__doc__ = (logsumexp.__doc__ or "") + _VOCAB_DOC


def cross_entropy(
    comm: Any,
    logits: Any,
    vocab_begin: int,
    targets: Any,
    /,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    grad: bool = False,
    deterministic: bool = False,
) -> Any:
    """Vocabulary-parallel cross-entropy: :func:`softdot.cross_entropy` of
    logits whose columns (the vocabulary) are split across the ranks.

    ``targets`` (the same on every rank, checked) are global class indices;
    the target's logit comes from the rank holding it; label smoothing
    spreads ``eps / V`` over the global vocabulary V. The loss (scalar for
    "mean" / "sum", (rows,) for "none") is the same on every rank; with
    ``grad=True`` each rank also gets its columns of the gradient,
    ``c (softmax - (1 - eps) one_hot - eps / V)``, computed locally from the
    merged state. The caller's logits are never modified. Bounds and special
    values as :func:`softdot.cross_entropy`.
    """
    fn = "cross_entropy"
    h = _handle(fn, comm)

    def prepare() -> Tuple[Any, ...]:
        xa, kind, single, vb = _shard(fn, logits, vocab_begin)
        t = _xent.class_targets(fn, targets, kind)
        if single:
            if t.ndim != 0:
                raise ValueError(
                    f"{fn}: logits have shape {xa.shape[1:]} (one row) but targets "
                    f"{t.shape}; expected a 0-d target"
                )
            t = t.reshape(1)
        elif t.shape != (xa.shape[0],):
            raise ValueError(
                f"{fn}: logits have shape {xa.shape} but targets {t.shape}; "
                f"expected ({xa.shape[0]},)"
            )
        eps = _xent.check_options(fn, label_smoothing, reduction)
        return xa, kind, single, vb, t, eps

    xa, kind, single, vb, t, eps = _agreed(comm, fn, prepare)
    n = xa.shape[0]
    loss_user: Any = None
    loss_view: Any = None
    if reduction == "none":
        loss_user, loss_view = A.new_output((n,), xa.dtype, kind)
    grad_user: Any = None
    grad_view: Any = None
    if grad:
        grad_user, grad_view = A.new_output(xa.shape, xa.dtype, kind)
    value = _mpi.vocab_cross_entropy(
        h,
        xa,
        vb,
        t,
        loss_view,
        grad_view,
        int(ignore_index),
        eps,
        _xent.REDUCTIONS[reduction],
        bool(deterministic),
    )
    if reduction == "none":
        loss = loss_user.reshape(()) if single else loss_user
    else:
        loss = A.wrap_scalar(value, xa.dtype, kind)
    if not grad:
        return loss
    return loss, (grad_user.reshape(-1) if single else grad_user)


def linear_cross_entropy(
    comm: Any,
    hidden: Any,
    weight: Any,
    vocab_begin: int,
    targets: Any,
    /,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    grad: bool = False,
    deterministic: bool = False,
) -> Any:
    """Vocabulary-parallel :func:`softdot.linear_cross_entropy`: every rank
    passes the same ``hidden`` (N, D) and ``targets`` (global class indices)
    and its own rows ``[vocab_begin, vocab_begin + V_r)`` of the weight
    (V_r, D), V_r >= 0; the ranks' rows must tile [0, V). No rank forms the
    whole vocabulary's logits: each block of rows' logits is formed on every
    rank over its rows of the weight, and their softmax states are exchanged
    and merged (C++ ``softdot::mpi::linear_cross_entropy``,
    include/softdot/mpi_vocab.h).

    float32, or bfloat16 (torch.bfloat16, ml_dtypes.bfloat16) for both
    operands; numpy arrays or CPU torch tensors (no autograd here: the
    gradients come back as arrays). Returns the loss (float32 scalar, or (N,)
    for "none"), the same on every rank, or with ``grad=True``
    ``(loss, grad_hidden, grad_weight)``: grad_hidden (N, D) the same on every
    rank (the ranks' partial products added in vocabulary order),
    grad_weight (V_r, D) this rank's rows. On one rank the bits are those of
    :func:`softdot.linear_cross_entropy`; ``deterministic=True`` makes the loss
    and grad_weight the same bits for every rank count and split. A hidden,
    targets or options different on some rank raise ValueError on every rank.
    """
    from . import _linear_cross_entropy as _lce

    fn = "linear_cross_entropy"
    h_ = _handle(fn, comm)

    def prepare() -> Tuple[Any, ...]:
        ops = _lce.operands(hidden, weight, targets, label_smoothing, reduction)
        return (*ops, _vocab_begin(fn, vocab_begin))

    h, w, t, eps, kind, vb = _agreed(comm, fn, prepare)
    red = _xent.REDUCTIONS[reduction]
    return _lce.with_outputs(
        lambda loss, gh, gw: _mpi.vocab_linear_cross_entropy(
            h_, h, w, vb, t, loss, gh, gw, int(ignore_index), eps, red, bool(deterministic)
        ),
        h.shape[0],
        h.shape[1],
        w.shape[0],
        kind,
        reduction,
        grad,
    )
