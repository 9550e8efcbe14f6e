"""softdot.distributed's vocabulary-parallel functions: rows whose columns
(the vocabulary) are split across the ranks of an mpi4py communicator
(softmax, log_softmax, logsumexp, cross_entropy, linear_cross_entropy; C++
softdot::mpi, include/softdot/mpi_vocab.h). softdot.distributed re-exports
them; see its docstring and docs/python.md."""

from __future__ import annotations

from typing import Any, Tuple

from . import _arrays as A
from . import _cross_entropy as _xent
from . import _mpi_comm as C

__all__ = ["softmax", "log_softmax", "logsumexp", "cross_entropy", "linear_cross_entropy"]


def _shard(fn: str, x: Any, vocab_begin: Any):
    """(2-d float rows of x, kind, whether x was one row, vocab_begin)."""
    kind = A.kind_of(x)
    xa = A.float_input(fn, "x", x, kind)
    single = xa.ndim == 1
    if single:
        xa = xa.reshape(1, -1)
    elif xa.ndim != 2:
        raise ValueError(f"{fn}: x has shape {xa.shape}; expected (rows, columns) or (columns,)")
    vb = C.at_least(fn, "vocab_begin", vocab_begin, 0)
    return A.contiguous_rows(xa), kind, single, vb


def _rows(fn: str, comm: Any, x: Any, vocab_begin: Any) -> Tuple[Any, ...]:
    """(comm's handle, then _shard's (rows, kind, single, vocab_begin)), the
    ranks agreed on the checks."""
    h = C.handle(fn, comm)
    return (h, *C.agreed(comm, fn, lambda: _shard(fn, x, vocab_begin)))


def _rows_op(fn: str, comm: Any, x: Any, vocab_begin: Any, op: int, deterministic: bool):
    h, xa, kind, single, vb = _rows(fn, comm, x, vocab_begin)
    user, o = A.new_output(xa.shape, xa.dtype, kind)
    C.mpi.vocab_rows(h, xa, o, vb, op, bool(deterministic))
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
    h, xa, kind, single, vb = _rows(fn, comm, x, vocab_begin)
    user, o = A.new_output((xa.shape[0],), xa.dtype, kind)
    C.mpi.vocab_logsumexp(h, xa, o, vb, bool(deterministic))
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
    h = C.handle(fn, comm)

    def prepare() -> Tuple[Any, ...]:
        xa, kind, single, vb = _shard(fn, logits, vocab_begin)
        t = _xent.row_targets(fn, xa, single, _xent.class_targets(fn, targets, kind))
        eps = _xent.check_options(fn, label_smoothing, reduction)
        return xa, kind, single, vb, t, eps

    xa, kind, single, vb, t, eps = C.agreed(comm, fn, prepare)

    def rows(loss: Any, g: Any) -> float:
        ii, red = int(ignore_index), _xent.REDUCTIONS[reduction]
        return C.mpi.vocab_cross_entropy(h, xa, vb, t, loss, g, ii, eps, red, bool(deterministic))

    return _xent.rows_result(rows, xa, kind, single, reduction, grad)


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
    h_ = C.handle(fn, comm)

    def prepare() -> Tuple[Any, ...]:
        ops = _lce.operands(hidden, weight, targets, label_smoothing, reduction)
        return (*ops, C.at_least(fn, "vocab_begin", vocab_begin, 0))

    h, w, t, eps, kind, vb = C.agreed(comm, fn, prepare)

    def rows(loss: Any, gh: Any, gw: Any) -> float:
        ii, red = int(ignore_index), _xent.REDUCTIONS[reduction]
        return C.mpi.vocab_linear_cross_entropy(
            h_, h, w, vb, t, loss, gh, gw, ii, eps, red, bool(deterministic)
        )

    return _lce.with_outputs(rows, h, w, kind, reduction, grad)
