"""The MPI module of softdot.distributed and what every collective call does
first: the communicator's Fortran handle, the integer arguments' checks,
and the ranks' agreement on the local checks before any data moves
(softdot.distributed's ring attention, _vocab_parallel.py's
vocabulary-parallel rows)."""

from __future__ import annotations

from typing import Any

MPI_MISSING = (
    "softdot.distributed needs softdot built with MPI for mpi4py communicators (the module "
    "softdot._softdot_mpi is missing): install an MPI (Debian: apt-get install "
    "libopenmpi-dev openmpi-bin), reinstall softdot (pip install .), and "
    "pip install mpi4py; or pass a torch.distributed process group (group=)"
)
try:
    from . import _softdot_mpi as mpi_module
except ImportError:  # pragma: no cover - depends on the build
    mpi_module = None


class _NeedMPI:
    """Stands for the MPI module where the build has none: any use raises
    ImportError saying what to install (the torch.distributed path of
    ring_attention needs no MPI)."""

    def __getattr__(self, name: str) -> Any:
        raise ImportError(MPI_MISSING)


mpi: Any = mpi_module if mpi_module is not None else _NeedMPI()


def handle(fn: str, comm: Any) -> int:
    """comm's Fortran handle; ImportError first where softdot has no MPI."""
    if mpi_module is None:
        raise ImportError(MPI_MISSING)
    f = getattr(comm, "py2f", None)
    if f is None:
        raise TypeError(
            f"{fn}: comm must be an mpi4py communicator (with py2f()), not {type(comm).__name__}"
        )
    return int(f())


def at_least(fn: str, name: str, x: Any, least: int) -> int:
    """x as an int >= least (seq_len, vocab_begin), else TypeError /
    ValueError naming fn and name."""
    try:
        v = int(x)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: {name} must be an int, not {x!r}") from None
    if v < least:
        raise ValueError(f"{fn}: {name} must be >= {least}, got {v}")
    return v


def agreed(comm: Any, fn: str, prepare: Any) -> Any:
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
