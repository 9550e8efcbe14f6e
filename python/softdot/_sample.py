"""Sampling the next token from rows of logits (softdot::sample) and
speculative decoding's rejection sampling (softdot::speculative_accept), for
numpy arrays and CPU torch tensors. See docs/python.md, "Sampling"."""

from __future__ import annotations

import math
import operator
from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _softdot as _core

_U64_MAX = (1 << 64) - 1


def _as_numpy(fn: str, name: str, x: Any, kind: str) -> Tuple[np.ndarray, bool]:
    """The numpy view of x (a CPU tensor's memory), and whether it holds
    bfloat16 bits as uint16 (torch.bfloat16 or ml_dtypes.bfloat16)."""
    if kind == "torch":
        A.check_device(fn, name, x)
        torch = A.torch_module()
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(A.U16), True
        return np.asarray(t.resolve_conj().resolve_neg().numpy()), False
    try:
        a = np.asarray(x)
    except ValueError:
        # numpy's "inhomogeneous shape": rows of different lengths.
        lens = sorted({len(r) for r in x}) if isinstance(x, (list, tuple)) else []
        raise ValueError(
            f"{fn}: {name} is ragged (rows of lengths {lens}); every row needs the same "
            f"length: one draft count K for the whole batch (call it once per group of "
            f"rows with the same K)"
        ) from None
    if a.dtype.name == "bfloat16":
        return a.view(A.U16), True
    return a, False


def _logits(fn: str, name: str, x: Any, kind: str) -> Tuple[np.ndarray, int]:
    """(array with a contiguous last axis, format): format 0 for float32, 1
    for bfloat16 bits, 2 for float16 bits."""
    a, bf16 = _as_numpy(fn, name, x, kind)
    if bf16:
        fmt = 1
    elif a.dtype == A.F32:
        fmt = 0
    elif a.dtype == A.F16:
        a, fmt = a.view(A.U16), 2
    else:
        raise TypeError(
            f"{fn}: {name} have dtype {A.dtype_str(x)}; expected float32, bfloat16 or float16"
        )
    if a.ndim == 0:
        raise ValueError(f"{fn}: {name} must have at least one dimension (the vocabulary)")
    if a.ndim > 1 and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        a = np.ascontiguousarray(a)
    return a, fmt


def _seeds(fn: str, seed: Any, rows: int) -> np.ndarray:
    """One uint64 seed per row: an int (every row the same seed) or rows
    integers in [0, 2^64)."""
    if A.is_torch(seed):
        seed = seed.detach().cpu().numpy()
    if isinstance(seed, np.ndarray) or isinstance(seed, (list, tuple)):
        vals = [operator.index(v) for v in np.asarray(seed, dtype=object).reshape(-1)]
        if len(vals) != rows:
            raise ValueError(f"{fn}: seed has {len(vals)} entries; expected one per row ({rows})")
    else:
        try:
            vals = [operator.index(seed)] * rows
        except TypeError:
            raise TypeError(
                f"{fn}: seed must be an int or a sequence of ints, not {type(seed).__name__}"
            ) from None
    for v in vals:
        if not 0 <= v <= _U64_MAX:
            raise ValueError(f"{fn}: seed {v} is outside [0, 2^64)")
    return np.array(vals, dtype=np.uint64)


def _options(fn: str, temperature: Any, top_k: Any, top_p: Any, min_p: Any) -> Tuple:
    try:
        t, p, mp = float(temperature), float(top_p), float(min_p)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: temperature, top_p and min_p must be real numbers") from None
    try:
        k = operator.index(top_k)
    except TypeError:
        raise TypeError(f"{fn}: top_k must be an int, not {type(top_k).__name__}") from None
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"{fn}: temperature must be finite and >= 0, got {t!r}")
    if k < 0:
        raise ValueError(f"{fn}: top_k must be >= 0 (0 = off), got {k}")
    if not 0 < p <= 1:
        raise ValueError(f"{fn}: top_p must be in (0, 1], got {p!r}")
    if not 0 <= mp <= 1:
        raise ValueError(f"{fn}: min_p must be in [0, 1], got {mp!r}")
    return t, min(k, (1 << 62)), p, mp


def _out(shape: Tuple[int, ...], dtype: Any, kind: str) -> Tuple[Any, np.ndarray]:
    if kind == "torch":
        torch = A.torch_module()
        tdt = torch.int64 if dtype == np.int64 else torch.float32
        t = torch.empty(shape, dtype=tdt)
        return t, t.numpy()
    a = np.empty(shape, dtype=dtype)
    return a, a


def sample(
    logits: Any,
    /,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: Any,
    bitmask: Any = None,
    return_logprobs: bool = False,
) -> Any:
    """Draw one token per row of logits, without sorting the vocabulary.

    The filters apply in Hugging Face's order: temperature (0 = greedy: the
    allowed argmax, ties to the lowest index), top-k (every token equal to
    the k-th largest logit is kept), top-p over the renormalised top-k set
    (the smallest set of the largest probabilities with mass >= top_p, every
    token equal to the boundary probability kept), min-p (probability >=
    min_p times the largest). The token is drawn from the kept set
    renormalised: exactly ``w_i / sum(w)`` with ``w_i = exp((x_i - max) /
    temperature)`` rounded once to float32 (within 0.51 ulp), the sums in
    double, up to V 2^-52.

    Parameters
    ----------
    logits : array or torch.Tensor, shape (B, V) or (V,)
        float32, bfloat16 (torch or ml_dtypes) or float16; rows may be
        strided (the last axis contiguous, else copied).
    seed : int or sequence of B ints in [0, 2^64)
        Keys a Philox4x32-10 generator per row: a row's token depends only
        on its seed, its logits, its bitmask row and the options (not on its
        position in the batch, the thread count or the SIMD target). An int
        gives every row the same seed. Vary it per generation step.
    bitmask : int32 array or tensor, shape (ceil(V / 32),) or (B, ceil(V / 32))
        xgrammar's packed format: bit ``j % 32`` of word ``j // 32`` set =
        token j allowed (uint32 accepted too).
    return_logprobs : bool
        Also return float32 log-probabilities of the drawn tokens under the
        final (filtered, renormalised) distribution; 0 for greedy rows.

    Returns
    -------
    tokens (int64, shape (B,) or ()), or (tokens, logprobs); torch in gives
    torch out.

    Errors: ValueError for a row with an allowed NaN logit or with no allowed
    token (all -inf or masked), naming the row; k logits +inf are drawn
    uniformly (logprob -log k).
    """
    fn = "sample"
    kind = A.kind_of(logits)
    x, fmt = _logits(fn, "logits", logits, kind)
    single = x.ndim == 1
    if single:
        x = x.reshape(1, -1)
    elif x.ndim != 2:
        raise ValueError(f"{fn}: logits have shape {x.shape}; expected (B, V) or (V,)")
    rows, vocab = x.shape
    if vocab == 0:
        raise ValueError(f"{fn}: logits have an empty vocabulary (V = 0)")
    t, k, p, mp = _options(fn, temperature, top_k, top_p, min_p)
    seeds = _seeds(fn, seed, rows)
    mask: Optional[np.ndarray] = None
    if bitmask is not None:
        m, _ = _as_numpy(fn, "bitmask", bitmask, A.kind_of(bitmask))
        if m.dtype == np.uint32:
            m = m.view(np.int32)
        if m.dtype != np.int32:
            raise TypeError(f"{fn}: bitmask has dtype {m.dtype}; expected int32 (packed bits)")
        words = (vocab + 31) // 32
        if m.shape not in ((words,), (rows, words)) and not (single and m.shape == (1, words)):
            raise ValueError(
                f"{fn}: bitmask has shape {m.shape}; expected ({words},) or ({rows}, {words}) "
                f"for V = {vocab}"
            )
        mask = np.ascontiguousarray(m).reshape(-1)
    tokens_user, tokens_view = _out((rows,), np.int64, kind)
    lp_user: Any = None
    lp_view: Optional[np.ndarray] = None
    if return_logprobs:
        lp_user, lp_view = _out((rows,), np.float32, kind)
    _core.sample_rows(x, fmt, seeds, tokens_view, lp_view, mask, t, k, p, mp)
    if single:
        tokens_user = tokens_user.reshape(())
        lp_user = lp_user.reshape(()) if return_logprobs else None
    return (tokens_user, lp_user) if return_logprobs else tokens_user


def speculative_accept(
    draft_tokens: Any,
    draft_probs: Any,
    target_logits: Any,
    /,
    *,
    seed: Any,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Tuple[Any, Any]:
    """Speculative decoding's rejection sampling for B rows of K draft tokens.

    draft_tokens: (B, K) integers; draft_probs: (B, K, V) float32, the draft
    model's probabilities at each draft position, or None for deterministic
    drafts (probability 1 on the draft token); target_logits: (B, K + 1, V)
    float32, the target model's logits at the K positions and one more. The
    target distribution q is the one ``sample`` draws from with the same
    options. Draft token x is accepted with probability min(1, q(x) / p(x));
    at the first rejection a token is drawn from norm(max(0, q - p)); if all
    K are accepted a bonus token is drawn from q at position K. Every output
    token is then distributed as q.

    Returns (accepted, tokens): accepted (B,) int64, the number of accepted
    drafts; tokens (B, K + 1) int64: the accepted drafts, the drawn token,
    then -1. torch in (target_logits) gives torch out.
    """
    fn = "speculative_accept"
    kind = A.kind_of(target_logits)
    tl, fmt = _logits(fn, "target_logits", target_logits, kind)
    if fmt != 0:
        raise TypeError(f"{fn}: target_logits must be float32")
    dt, _ = _as_numpy(fn, "draft_tokens", draft_tokens, A.kind_of(draft_tokens))
    if dt.dtype.kind not in "iu":
        raise TypeError(f"{fn}: draft_tokens have dtype {dt.dtype}; expected integers")
    if dt.ndim != 2:
        raise ValueError(f"{fn}: draft_tokens have shape {dt.shape}; expected (B, K)")
    rows, k = dt.shape
    if tl.ndim != 3 or tl.shape[:2] != (rows, k + 1):
        raise ValueError(
            f"{fn}: target_logits have shape {tl.shape}; expected ({rows}, {k + 1}, V)"
        )
    vocab = tl.shape[2]
    dp: Optional[np.ndarray] = None
    if draft_probs is not None:
        dp, _ = _as_numpy(fn, "draft_probs", draft_probs, A.kind_of(draft_probs))
        if dp.dtype != A.F32:
            raise TypeError(f"{fn}: draft_probs have dtype {dp.dtype}; expected float32")
        if dp.shape != (rows, k, vocab):
            raise ValueError(
                f"{fn}: draft_probs have shape {dp.shape}; expected ({rows}, {k}, {vocab})"
            )
        dp = np.ascontiguousarray(dp).reshape(rows * k, vocab)
    t, kk, p, mp = _options(fn, temperature, top_k, top_p, min_p)
    seeds = _seeds(fn, seed, rows)
    dt64 = np.ascontiguousarray(dt, dtype=np.int64)
    tl2 = np.ascontiguousarray(tl).reshape(rows * (k + 1), vocab)
    acc_user, acc_view = _out((rows,), np.int64, kind)
    tok_user, tok_view = _out((rows, k + 1), np.int64, kind)
    _core.speculative_accept_rows(
        dt64, dp, tl2, seeds, acc_view, tok_view.reshape(-1), t, kk, p, mp
    )
    return acc_user, tok_user
