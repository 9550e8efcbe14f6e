"""softdot: faithful softmax, accurate dot products and fused attention for
numpy arrays and CPU torch tensors, from the same C++ core as the softdot
library and command.

Every function takes its array positionally and its options by keyword,
returns the same kind of array it was given (numpy in, numpy out; torch in,
torch out), reads any layout whose last axis is contiguous without a copy,
and releases the GIL while it computes. See docs/python.md.

The optional submodules softdot.torch (autograd), softdot.dask and
softdot.distributed (MPI) are imported on first use, ``softdot.torch.softmax``
after a plain ``import softdot`` (PEP 562), so that ``import softdot`` imports
neither torch nor dask nor mpi4py.
"""

import importlib
from typing import Any, List

from . import _softdot
from ._attention import attention_merge, attention_weights, scaled_dot_product_attention
from ._losses import cross_entropy, linear_cross_entropy
from ._paged import paged_attention, write_kv
from ._quantize import quantize_kv
from ._sample import sample, speculative_accept
from ._softdot import (
    force_matrix_unit,
    force_simd_target,
    matrix_unit,
    matrix_units,
    simd_target,
    simd_targets,
)
from ._softmax import (
    SoftmaxState,
    dot,
    dots,
    log_softmax,
    logsumexp,
    softmax,
    softmax_apply,
    softmax_backward,
    softmax_state,
)

# The core sets __version__ as a module attribute, which nanobind's
# generated stub (_softdot.pyi) does not list.
__version__: str = _softdot.__version__  # type: ignore[attr-defined]

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "softmax_backward",
    "cross_entropy",
    "sample",
    "speculative_accept",
    "linear_cross_entropy",
    "dot",
    "dots",
    "softmax_state",
    "softmax_apply",
    "SoftmaxState",
    "scaled_dot_product_attention",
    "attention_merge",
    "attention_weights",
    "quantize_kv",
    "paged_attention",
    "write_kv",
    "simd_target",
    "simd_targets",
    "force_simd_target",
    "matrix_units",
    "matrix_unit",
    "force_matrix_unit",
    "__version__",
]

# Submodules imported by the first attribute access (module __getattr__).
_LAZY_SUBMODULES = ("torch", "dask", "distributed")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        # Importing sets the attribute, so this runs once per submodule; an
        # ImportError (dask or mpi4py missing) says what to install.
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
