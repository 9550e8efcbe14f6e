"""Fused scaled dot-product attention, its merge and its explicit weights, for
numpy arrays and CPU torch tensors. See docs/python.md."""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _int8
from . import _softdot as _core

_KV_F32, _KV_F16, _KV_BF16 = 0, 1, 2
_KV_I8 = 3  # an int8 (values, scales) pair (_int8.py); its own core functions
_KV_NAMES = {_KV_F32: "float32", _KV_F16: "float16", _KV_BF16: "bfloat16",
             _KV_I8: "int8 (a (values, scales) pair)"}
_SIZE_MAX = 2**64 - 1
_KV_ACCEPTED = "float32, float16, bfloat16, or a pair (int8 values, float32 scales)"
_KV_ACCEPTED_NP = ("float32, float16, bfloat16 (ml_dtypes.bfloat16), or a pair (int8 values, "
                   "float32 scales)")


def _kv_format(fn: str, name: str, a: Any, kind: str) -> Tuple[np.ndarray, int]:
    """(numpy array the core can read, format code) for a key or value array:
    16-bit formats travel as their bits."""
    if kind == "torch":
        torch = A.torch_module()
        fmt = {torch.float32: _KV_F32, torch.float16: _KV_F16, torch.bfloat16: _KV_BF16}.get(
            a.dtype
        )
        if fmt is None:
            raise A.accepted(fn, name, a, _KV_ACCEPTED)
        v = A.tensor_view(fn, name, a)
        return (v.view(A.U16) if fmt == _KV_F16 else v), fmt
    d = a.dtype
    if d == A.F32:
        return a, _KV_F32
    if d == A.F16:
        return a.view(A.U16), _KV_F16
    if d.name == "bfloat16":  # ml_dtypes.bfloat16: the bits, as uint16
        return a.view(A.U16), _KV_BF16
    raise A.accepted(fn, name, a, _KV_ACCEPTED_NP)


def _array(fn: str, name: str, a: Any, kind: str) -> Any:
    """An input of the query's library, on the CPU (torch stays torch here)."""
    a = A.secondary(fn, name, a, kind)
    if kind == "torch":
        A.check_device(fn, name, a)
    return a


def _np(fn: str, name: str, a: Any, kind: str) -> np.ndarray:
    return A.tensor_view(fn, name, a) if kind == "torch" else a


def _to4(a: np.ndarray) -> np.ndarray:
    """[..., L, E] as [B, H, L, E]: leading ones for 2-d and 3-d, the batch
    axes merged for more than 4 (a copy only if they cannot be merged)."""
    nd = a.ndim
    if nd == 4:
        return a
    if nd == 2:
        return a[None, None]
    if nd == 3:
        return a[None]
    return a.reshape((-1,) + a.shape[-3:])


def _ready(a: np.ndarray) -> np.ndarray:
    """Contiguous last axis and non-negative strides (the core's views)."""
    a = A.contiguous_rows(a)
    if any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def _no_grad(fn: str, kind: str, *arrays: Any) -> None:
    if kind != "torch":
        return
    torch = A.torch_module()
    if not torch.is_grad_enabled():
        return
    for a in arrays:
        if a is not None and A.is_torch(a) and a.requires_grad:
            raise NotImplementedError(
                f"{fn}: an input requires grad, and softdot's attention has no backward yet; "
                f"call it under torch.no_grad() or on detached tensors "
                f"(torch.nn.functional.scaled_dot_product_attention has one)"
            )


def _is_float(a: Any, kind: str) -> bool:
    return a.is_floating_point() if kind == "torch" else a.dtype.kind == "f"


class _Prepared:
    __slots__ = ("raw", "kind", "q", "k", "v", "fmt", "ks", "vs", "scales", "mask", "bias",
                 "sinks", "lead", "L", "S", "Ev", "scale", "wl", "wr", "softcap", "kv_begin", "kv_end", "causal")


def _prepare(fn, query, key, value, attn_mask, bias, scale, causal, window, softcap, sinks,
             kv_range) -> _Prepared:
    p = _Prepared()
    kind = A.kind_of(query)
    p.kind = kind
    _no_grad(fn, kind, query, key, value, attn_mask, bias, sinks)
    q = query if kind == "torch" else A.secondary(fn, "query", query, kind)
    if kind == "torch":
        A.check_device(fn, "query", q)
        if q.dtype != A.torch_module().float32:
            raise A.accepted(fn, "query", q, "float32")
    elif q.dtype != A.F32:
        raise A.accepted(fn, "query", q, "float32")
    q = _np(fn, "query", q, kind)

    def kv(name, a):
        """(array, format, scales): an int8 (values, scales) pair or one array."""
        pair = _int8.int8_kv(fn, name, a, kind)
        if pair is not None:
            return pair[0], _KV_I8, pair[1]
        return _kv_format(fn, name, _array(fn, name, a, kind), kind) + (None,)

    k, fk, ks = kv("key", key)
    v = vsc = None
    if value is not None:
        v, fv, vsc = kv("value", value)
        if fk != fv:
            raise TypeError(
                f"{fn}: key has dtype {_KV_NAMES[fk]} but value has dtype "
                f"{_KV_NAMES[fv]}; they must be the same"
            )
    vs = "" if v is None else f", value {v.shape}"
    if q.ndim < 2 or k.ndim != q.ndim or (v is not None and v.ndim != q.ndim):
        raise ValueError(
            f"{fn}: query {q.shape}, key {k.shape}{vs}: expected [..., L, E], [..., S, E] "
            f"and [..., S, Ev] with the same number of axes (2 or more)"
        )
    L, E = q.shape[-2], q.shape[-1]
    S = k.shape[-2]
    if k.shape[-1] != E:
        raise ValueError(
            f"{fn}: key has shape {k.shape} but query has shape {q.shape} "
            f"(the last axes, E, must match)"
        )
    if v is not None and v.shape[-2] != S:
        raise ValueError(
            f"{fn}: value has shape {v.shape} but key has shape {k.shape} "
            f"(the key axes, S, must match)"
        )
    if L == 0 or E == 0 or (v is not None and v.shape[-1] == 0):
        raise ValueError(f"{fn}: query {q.shape}{vs}: L, E and Ev must be >= 1")
    # Batch axes equal; query's heads a multiple of key's (GQA).
    qb, kb = q.shape[:-2], k.shape[:-2]
    hq = qb[-1] if qb else 1
    hk = kb[-1] if kb else 1
    if qb[:-1] != kb[:-1] or (v is not None and v.shape[:-2] != kb) or hk == 0 or hq % hk:
        raise ValueError(
            f"{fn}: query has shape {q.shape}, key {k.shape}{vs}: the batch axes must match "
            f"and query's heads be a multiple of key's (grouped-query attention)"
        )
    p.raw = [("query", q), ("key", k)] + ([] if v is None else [("value", v)])
    p.scales = [(n, a) for n, a in (("key", ks), ("value", vsc)) if a is not None]
    p.raw += [(f"{n} scales", a) for n, a in p.scales]
    p.ks = None if ks is None else _int8.ready_scales(_ready(_to4(ks)))
    p.vs = None if vsc is None else _int8.ready_scales(_ready(_to4(vsc)))
    p.lead, p.L, p.S = qb, L, S
    p.Ev = v.shape[-1] if v is not None else 0
    p.q, p.k = _ready(_to4(q)), _ready(_to4(k))
    p.v = None if v is None else _ready(_to4(v))
    p.fmt = fk
    full = qb + (L, S)

    def broadcast(name, a):
        try:
            return np.broadcast_to(a, full)
        except ValueError:
            raise ValueError(
                f"{fn}: {name} has shape {a.shape}, which does not broadcast to "
                f"{full} (query's batch axes, L, S)"
            ) from None

    # Masks: bool = attend, float = added (torch's rule), broadcast (no copy).
    p.mask = None
    biases = []
    if attn_mask is not None:
        m = _array(fn, "attn_mask", attn_mask, kind)
        if A.dtype_str(m) == "bool":
            p.mask = _ready(_to4(broadcast("attn_mask", _np(fn, "attn_mask", m, kind))))
        elif _is_float(m, kind):
            if kind == "torch" and m.dtype != A.torch_module().float32:
                m = m.float()
            biases.append(("attn_mask", _np(fn, "attn_mask", m, kind)))
        else:
            raise A.accepted(fn, "attn_mask", m, "bool (True = attend) or a float dtype (added)")
    if bias is not None:
        b = _array(fn, "bias", bias, kind)
        if not _is_float(b, kind):
            raise A.accepted(fn, "bias", b, "a float dtype")
        if kind == "torch" and b.dtype != A.torch_module().float32:
            b = b.float()
        biases.append(("bias", _np(fn, "bias", b, kind)))
    p.bias = None
    if biases:
        s = broadcast(*biases[0])
        if len(biases) == 2:
            s = s + broadcast(*biases[1])
        if s.dtype != A.F32:
            s = s.astype(A.F32)
        p.bias = _ready(_to4(s))

    if scale is None:
        p.scale = math.nan
    else:
        p.scale = float(scale)
        if not (math.isfinite(p.scale) and p.scale > 0):
            raise ValueError(f"{fn}: scale must be finite and > 0, got {scale!r}")
    p.causal = bool(causal)
    try:
        wl, wr = window
        p.wl, p.wr = int(wl), int(wr)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: window must be a pair (left, right) of ints, got {window!r}") from None
    if p.wl < -1 or p.wr < -1:
        raise ValueError(
            f"{fn}: window {tuple(window)!r}: -1 means unbounded; other negative values are "
            f"not allowed"
        )
    p.softcap = float(softcap)
    if not (math.isfinite(p.softcap) and p.softcap >= 0):
        raise ValueError(f"{fn}: softcap must be finite and >= 0, got {softcap!r}")
    p.sinks = None
    if sinks is not None:
        s = _array(fn, "sinks", sinks, kind)
        if kind == "torch":
            s = _np(fn, "sinks", s.float() if s.dtype != A.torch_module().float32 else s, kind)
        if s.ndim != 1 or s.shape[0] != hq:
            raise ValueError(
                f"{fn}: sinks has shape {s.shape}; expected ({hq},), one logit per query head"
            )
        p.sinks = np.ascontiguousarray(s, dtype=A.F32)
    if kv_range is None:
        p.kv_begin, p.kv_end = 0, _SIZE_MAX
    else:
        try:
            b, e = kv_range
        except (TypeError, ValueError):
            raise ValueError(f"{fn}: kv_range must be a pair (begin, end), got {kv_range!r}") from None
        p.kv_begin = int(b)
        p.kv_end = _SIZE_MAX if e is None else int(e)
        if p.kv_begin < 0 or p.kv_end < 0:
            raise ValueError(f"{fn}: kv_range {tuple(kv_range)!r} has a negative bound")
    return p


def _check_out_overlap(fn: str, o: np.ndarray, p: _Prepared) -> None:
    for name, a in p.raw + [("attn_mask", p.mask), ("bias", p.bias), ("sinks", p.sinks)]:
        A.check_overlap(fn, o, name, a, False)


def _target(o: np.ndarray) -> Tuple[np.ndarray, bool]:
    """(4-d array the core writes, whether it is o's memory)."""
    o4 = _to4(o)
    direct = (A.row_contiguous(o4) and all(s >= 0 for s in o4.strides)
              and (o.ndim <= 4 or np.shares_memory(o4, o)))
    return (o4, True) if direct else (np.empty(o4.shape, o.dtype), False)


_CAUSAL_DOC = """
    ``causal`` is aligned bottom-right: query i of L sees keys j <= i + S - L,
    so the last query sees the last key (the KV-cache convention of
    flash-attn). torch's ``is_causal`` is aligned top-left (j <= i); the two
    agree when L == S. For torch's rule with L != S pass a boolean
    ``attn_mask`` (``torch.ones(L, S, dtype=bool).tril()``)."""


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    *,
    bias: Any = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    kv_range: Optional[Tuple[int, Optional[int]]] = None,
    return_lse: bool = False,
    out: Any = None,
    precise: bool = False,
) -> Any:
    """Fused attention: ``out = softmax(mask(bias + cap(scale * Q K^T))) V``,
    never forming the L x S score matrix.

    Parameters
    ----------
    query : array [..., Hq, L, E], float32
        torch's layout (B, H, L, E); 2-d and 3-d inputs get leading ones.
    key : array [..., Hkv, S, E]; float32, float16 or bfloat16
        (torch.bfloat16, or numpy arrays of ml_dtypes.bfloat16), or an int8
        pair ``(values, scales)``: int8 [..., Hkv, S, E] and float32
        [..., Hkv, S, 1], as :func:`quantize_kv` returns it, standing for
        ``scales * values`` rounded to float32 (the result equals the float32
        call on those values bit for bit). Hq must be a multiple of Hkv
        (grouped-query attention; Hkv = 1 is multi-query).
    value : array [..., Hkv, S, Ev] of key's dtype, or an int8 pair when key is one.
    attn_mask : array broadcastable to [..., Hq, L, S], optional
        bool: True = attend (torch's rule); float: added to the scores.
    bias : float array broadcastable to [..., Hq, L, S], optional
        Added to the (scaled, soft-capped) scores; -inf masks a key.
    scale : float, optional
        Default ``1 / sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (see below).
    window : (int, int), default (-1, -1)
        Sliding window (left, right) around each query's position; -1 is
        unbounded.
    softcap : float, default 0
        When > 0 each scaled score s becomes ``softcap * tanh(s / softcap)``.
    sinks : array [Hq], optional
        One logit per query head added to each row's denominator.
    kv_range : (begin, end), optional
        Use only keys begin <= j < end (end None = all); positions, masks and
        biases still refer to the full key axis, so results over [a, b) and
        [b, c) merged by :func:`attention_merge` equal [a, c).
    return_lse : bool, default False
        Also return the log-sum-exp of each row's scores, shape [..., L].
    out : array [..., Hq, L, Ev], float32, optional
    precise : bool, default False
        Scores in double, carried as two floats into exp (C++
        ``AttentionOptions::precise``): a few u W of error even for scores
        near +-100, at about twice the score cost; always the prefill form.

    Returns
    -------
    out, or (out, lse)

    Notes
    -----
    Error bound (docs/accuracy.md): with W = sum_j w_j |V_j| and u = 2^-24,
    ``|O - exact| <= (2 D + 70 u) W + u |exact| + 2^-149 (S + 1 + sum |V|)``,
    D being the rounding of the float scores. A fully masked row gives zeros
    and lse -inf (torch gives NaN or zeros depending on the version); NaN in a
    visible key or value is never hidden; masked ones never leak. Results are
    bitwise the same for every thread count. The GIL is released.
    A torch input that requires grad raises NotImplementedError: attention's
    backward is not there yet.
    """
    fn = "scaled_dot_product_attention"
    p = _prepare(fn, query, key, value, attn_mask, bias, scale, causal, window, softcap, sinks,
                 kv_range)
    shape = p.lead + (p.L, p.Ev)
    user, o = A.output(fn, out, shape, A.F32, p.kind)
    if out is not None:
        _check_out_overlap(fn, o, p)
    target, direct = _target(o)
    lse_user, lse = A.new_output(p.lead + (p.L,), A.F32, p.kind) if return_lse else (None, None)
    if p.fmt == _KV_I8:
        _int8.check_scales_on_error(fn, p.scales, lambda: _core.attention_int8(
            p.q, p.k, p.ks, p.v, p.vs, target, p.mask, p.bias, p.sinks, lse, p.scale, p.causal,
            p.wl, p.wr, p.softcap, p.kv_begin, p.kv_end, bool(precise)))
    else:
        _core.attention(p.q, p.k, p.v, target, p.fmt, p.mask, p.bias, p.sinks, lse, p.scale,
                        p.causal, p.wl, p.wr, p.softcap, p.kv_begin, p.kv_end, bool(precise))
    if not direct:
        np.copyto(o, target.reshape(shape))
    return (user, lse_user) if return_lse else user


scaled_dot_product_attention.__doc__ += _CAUSAL_DOC


def attention_weights(
    query: Any,
    key: Any,
    attn_mask: Any = None,
    *,
    bias: Any = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    kv_range: Optional[Tuple[int, Optional[int]]] = None,
    out: Any = None,
) -> Any:
    """The explicit weights [..., Hq, L, S] that :func:`scaled_dot_product_attention`
    applies to V, with the same options (for small inputs: inspection, teaching).

    key may be an int8 ``(values, scales)`` pair, as for
    :func:`scaled_dot_product_attention`.
    Scores are computed as the fused prefill form computes them (the same
    bits); the weights are rounded once from double arithmetic, so
    ``weights @ V`` equals the fused output within its bound. Keys outside
    ``kv_range`` and masked keys get weight +0.
    """
    fn = "attention_weights"
    p = _prepare(fn, query, key, None, attn_mask, bias, scale, causal, window, softcap, sinks,
                 kv_range)
    shape = p.lead + (p.L, p.S)
    user, o = A.output(fn, out, shape, A.F32, p.kind)
    if out is not None:
        _check_out_overlap(fn, o, p)
    target, direct = _target(o)
    if p.fmt == _KV_I8:
        _int8.check_scales_on_error(fn, p.scales, lambda: _core.attention_weights_int8(
            p.q, p.k, p.ks, target, p.mask, p.bias, p.sinks, p.scale, p.causal, p.wl, p.wr,
            p.softcap, p.kv_begin, p.kv_end))
    else:
        _core.attention_weights(p.q, p.k, target, p.fmt, p.mask, p.bias, p.sinks, p.scale,
                                p.causal, p.wl, p.wr, p.softcap, p.kv_begin, p.kv_end)
    if not direct:
        np.copyto(o, target.reshape(shape))
    return user


attention_weights.__doc__ += _CAUSAL_DOC


def attention_merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, /, *, out: Any = None):
    """Merges two partial attention results over disjoint key ranges
    (split-KV decoding, ring attention):
    ``m = max(lse_a, lse_b)``, ``w = exp(lse - m)``,
    ``out = (w_a o_a + w_b o_b) / (w_a + w_b)``, ``lse = m + log(w_a + w_b)``,
    in double, rounded once to float32. A part with lse -inf is the identity.

    Parameters
    ----------
    out_a, out_b : float32 arrays [..., L, Ev]
    lse_a, lse_b : float32 arrays [..., L]
    out : float32 array [..., L, Ev], optional; may be out_a or out_b.

    Returns
    -------
    (out, lse)
    """
    fn = "attention_merge"
    kind = A.kind_of(out_a)
    arrs = []
    for name, a in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        a = _array(fn, name, a, kind)
        if A.dtype_str(a) != "float32":
            raise A.accepted(fn, name, a, "float32")
        arrs.append(_np(fn, name, a, kind))
    oa, la, ob, lb = arrs
    if oa.ndim < 2 or oa.shape != ob.shape:
        raise ValueError(
            f"{fn}: out_a has shape {oa.shape} and out_b {ob.shape}; they must be equal, "
            f"[..., L, Ev]"
        )
    lshape = oa.shape[:-1]
    for name, a in (("lse_a", la), ("lse_b", lb)):
        if a.shape != lshape:
            raise ValueError(f"{fn}: {name} has shape {a.shape}; expected {lshape}")
    user, o = A.output(fn, out, oa.shape, A.F32, kind)
    if out is not None:
        A.check_overlap(fn, o, "out_a", oa, True)
        A.check_overlap(fn, o, "out_b", ob, True)
        A.check_overlap(fn, o, "lse_a", la, False)
        A.check_overlap(fn, o, "lse_b", lb, False)
    lse_user, lse = A.new_output(lshape, A.F32, kind)
    target, direct = _target(o)
    _core.attention_merge(_ready(_to4(oa)), np.ascontiguousarray(la), _ready(_to4(ob)),
                          np.ascontiguousarray(lb), target, lse)
    if not direct:
        np.copyto(o, target.reshape(oa.shape))
    return user, lse_user
