"""One attention request from keyword arguments: the one place the Python
layer turns what a caller passes to scaled_dot_product_attention,
attention_weights, paged_attention or softdot.distributed.ring_attention into
what the C++ library's AttentionRequest takes (include/softdot/
attention_request.h): the query as a 4-d view, a K/V source (a dict: format,
arrays, int8 scales, page table) and the options (a dict). The library checks
every option's value, once, with one message naming the caller's function;
here only what must be settled before an array reaches it is checked (library,
dtype, axes, broadcasting, a pair's form). Nothing is computed here.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _int8
from . import _softdot as _core
from . import _terms as T

# The core's storage format codes (KVFormat), by name, and the bindings' own
# code for float64 arrays (the double functions, which a float64 request runs).
_FORMATS = _core.kv_formats
KV_F32, KV_F16, KV_BF16, KV_I8, KV_F64 = (
    int(_FORMATS[n]) for n in ("float32", "float16", "bfloat16", "int8", "float64")
)
KV_E4M3, KV_E5M2 = (int(_FORMATS[n]) for n in ("float8_e4m3fn", "float8_e5m2"))
KV_FP8 = (KV_E4M3, KV_E5M2)
KV_NAMES = {
    KV_F32: "float32",
    KV_F16: "float16",
    KV_BF16: "bfloat16",
    KV_I8: "int8 (a (values, scales) pair)",
    KV_E4M3: "float8_e4m3fn",
    KV_E5M2: "float8_e5m2",
}
SIZE_MAX = 2**64 - 1
_KV_ACCEPTED = (
    "float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
    "or a pair (int8 values, float32 scales)"
)
_KV_ACCEPTED_NP = (
    "float32, float16, bfloat16 (ml_dtypes.bfloat16), float8_e4m3fn, float8_e5m2 "
    "(ml_dtypes), or a pair (int8 values, float32 scales)"
)

CAUSAL_DOC = """
    ``causal`` is aligned bottom-right: query i of L sees keys j <= i + S - L,
    so the last query sees the last key (the KV-cache convention of
    flash-attn). torch's ``is_causal`` is aligned top-left (j <= i); the two
    agree when L == S. ``is_causal=True`` is accepted with torch's meaning
    (top-left, by query and key positions); ``enable_gqa`` is accepted (grouped
    heads are always enabled) and ``dropout_p`` must be 0."""


def kv_format(fn: str, name: str, a: Any, kind: str) -> Tuple[np.ndarray, int]:
    """(numpy array the core can read, format code) for a key or value array:
    16-bit formats travel as their bits."""
    if kind == "torch":
        torch = A.torch_module()
        fmt = {
            torch.float32: KV_F32,
            torch.float16: KV_F16,
            torch.bfloat16: KV_BF16,
            torch.float8_e4m3fn: KV_E4M3,
            torch.float8_e5m2: KV_E5M2,
        }.get(a.dtype)
        if fmt is None:
            raise A.accepted(fn, name, a, _KV_ACCEPTED)
        v = A.tensor_view(fn, name, a)
        return (v.view(A.U16) if fmt == KV_F16 else v), fmt
    d = a.dtype
    if d == A.F32:
        return a, KV_F32
    if d == A.F16:
        return a.view(A.U16), KV_F16
    if d.name == "bfloat16":  # ml_dtypes.bfloat16: the bits, as uint16
        return a.view(A.U16), KV_BF16
    if d.name == "float8_e4m3fn":  # ml_dtypes' fp8: the bytes
        return a.view(A.U8), KV_E4M3
    if d.name == "float8_e5m2":
        return a.view(A.U8), KV_E5M2
    raise A.accepted(fn, name, a, _KV_ACCEPTED_NP)


def fp8_scale(
    fn: str, name: str, scale: Any, fmt: int, values_shape: Tuple[int, ...], kind: str
) -> Tuple[Optional[float], Optional[np.ndarray]]:
    """An fp8 cache's scale (``k_scale=`` / ``v_scale=``) as (per-tensor
    float, None) or (None, float32 array of values_shape[:-1] + (1,)): one per
    token and head. Refused (ValueError) for a cache that is not fp8 unless
    it is None or 1.0."""
    if fmt not in KV_FP8:
        if scale is None or (isinstance(scale, (int, float)) and float(scale) == 1.0):
            return None, None
        raise ValueError(
            f"{fn}: {name} is given but the cache is {KV_NAMES.get(fmt, '?')}; "
            f"{name} scales fp8 caches only"
        )
    if scale is None:
        return 1.0, None
    if isinstance(scale, (int, float, np.floating, np.integer)) and not isinstance(scale, bool):
        s = float(scale)
        if not (np.isfinite(s) and s >= 0):
            raise ValueError(f"{fn}: {name} = {s} must be finite and >= 0")
        return s, None
    a = as_numpy(fn, name, array(fn, name, scale, kind), kind)
    if a.ndim == 0 or a.size == 1 and a.ndim <= 1:
        return fp8_scale(fn, name, float(a.reshape(())), fmt, values_shape, kind)
    if a.dtype != A.F32:
        raise A.accepted(fn, name, a, "float32 (per token and head), or a float")
    want = tuple(values_shape[:-1])
    if a.shape == want:
        a = a[..., None]
    elif a.shape != want + (1,):
        raise ValueError(
            f"{fn}: {name} has shape {a.shape}; expected a float or {want} "
            f"(one per token and head of {tuple(values_shape)})"
        )
    return None, a


def array(fn: str, name: str, a: Any, kind: str) -> Any:
    """An input of the query's library, on the CPU (torch stays torch here)."""
    a = A.secondary(fn, name, a, kind)
    if kind == "torch":
        A.check_device(fn, name, a)
    return a


def as_numpy(fn: str, name: str, a: Any, kind: str) -> np.ndarray:
    return A.tensor_view(fn, name, a) if kind == "torch" else a


def to4(a: np.ndarray) -> np.ndarray:
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


def ready(a: np.ndarray) -> np.ndarray:
    """Contiguous last axis and non-negative strides (the core's views)."""
    a = A.contiguous_rows(a)
    if any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def no_grad(fn: str, kind: str, *arrays: Any) -> None:
    if kind != "torch":
        return
    torch = A.torch_module()
    if not torch.is_grad_enabled():
        return
    for a in arrays:
        if a is not None and A.is_torch(a) and a.requires_grad:
            raise NotImplementedError(
                f"{fn}: an input requires grad, and softdot.{fn} has no backward "
                f"(softdot.scaled_dot_product_attention has one); "
                f"call it under torch.no_grad() or on detached tensors"
            )


def is_float(a: Any, kind: str) -> bool:
    return bool(a.is_floating_point() if kind == "torch" else a.dtype.kind == "f")


_Q_ACCEPTED = "float32, float16, bfloat16"
_Q_ACCEPTED_NP = "float32, float16, bfloat16 (ml_dtypes.bfloat16)"


def query(fn: str, q: Any, kind: str) -> Tuple[np.ndarray, int, Any]:
    """(numpy view of the query's memory, its format, its dtype): float32,
    or float16 / bfloat16 as their bits (uint16), never widened here."""
    q = q if kind == "torch" else A.secondary(fn, "query", q, kind)
    if kind == "torch":
        A.check_device(fn, "query", q)
        torch = A.torch_module()
        fmt = {torch.float32: KV_F32, torch.float16: KV_F16, torch.bfloat16: KV_BF16}.get(q.dtype)
        if fmt is None:
            raise A.accepted(fn, "query", q, _Q_ACCEPTED)
        v = A.tensor_view(fn, "query", q)
        return (v.view(A.U16) if fmt == KV_F16 else v), fmt, q.dtype
    d = q.dtype
    if d == A.F32:
        return q, KV_F32, d
    if d == A.F16:
        return q.view(A.U16), KV_F16, d
    if d.name == "bfloat16":  # ml_dtypes.bfloat16: the bits, as uint16
        return q.view(A.U16), KV_BF16, d
    raise A.accepted(fn, "query", q, _Q_ACCEPTED_NP)


def result(
    fn: str, out: Any, shape: Tuple[int, ...], q_format: int, q_dtype: Any, kind: str
) -> Tuple[Any, np.ndarray, int]:
    """(what the caller gets, the numpy array the core writes, its format):
    the attention output in the query's dtype (16-bit: written as bits), or
    in out's when the caller passes one of the query's dtype or float32."""
    if q_format == KV_F32:
        user, arr = A.output(fn, out, shape, A.F32, kind)
        return user, arr, KV_F32
    name = KV_NAMES[q_format]
    if out is None:
        if kind == "torch":
            t = A.torch_module().empty(shape, dtype=q_dtype)
            return t, A.tensor_view(fn, "out", t).view(A.U16), q_format
        a = np.empty(shape, dtype=q_dtype)
        return a, a.view(A.U16), q_format
    is_f32 = (
        (out.dtype == A.torch_module().float32)
        if A.is_torch(out)
        else (getattr(out, "dtype", None) == A.F32)
    )
    if is_f32:
        user, arr = A.user_output(fn, out, shape, A.F32, kind)
        return user, arr, KV_F32
    user, arr = A.user_output(
        fn, out, shape, A.F32, kind, native=q_dtype, expected=f"{name} (the query's) or float32"
    )
    return user, arr.view(A.U16), q_format


def masks(
    fn: str, attn_mask: Any, bias: Any, kind: str, full: Tuple[int, ...], what: str
) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(mask, bias) as 4-d views broadcast to ``full`` (no copy): a bool
    attn_mask is the mask (True = attend), a float one is added to the bias
    (torch's rule). ``what`` says what full's axes are, for the message."""

    def bcast(name: str, a: np.ndarray) -> np.ndarray:
        try:
            return np.broadcast_to(a, full)
        except ValueError:
            raise ValueError(
                f"{fn}: {name} has shape {a.shape}, which does not broadcast to {full} ({what})"
            ) from None

    mask = None
    biases: List[Tuple[str, np.ndarray]] = []
    if attn_mask is not None:
        m = array(fn, "attn_mask", attn_mask, kind)
        if A.dtype_str(m) == "bool":
            mask = ready(to4(bcast("attn_mask", as_numpy(fn, "attn_mask", m, kind))))
        elif is_float(m, kind):
            if kind == "torch" and m.dtype != A.torch_module().float32:
                m = m.float()
            biases.append(("attn_mask", as_numpy(fn, "attn_mask", m, kind)))
        else:
            raise A.accepted(fn, "attn_mask", m, "bool (True = attend) or a float dtype (added)")
    if bias is not None:
        b = array(fn, "bias", bias, kind)
        if not is_float(b, kind):
            raise A.accepted(fn, "bias", b, "a float dtype")
        if kind == "torch" and b.dtype != A.torch_module().float32:
            b = b.float()
        biases.append(("bias", as_numpy(fn, "bias", b, kind)))
    bias4 = None
    if biases:
        s = bcast(*biases[0])
        if len(biases) == 2:
            s = s + bcast(*biases[1])
        bias4 = ready(to4(s.astype(A.F32, copy=False)))
    return mask, bias4


def sinks_array(
    fn: str, sinks: Any, kind: str, name: str = "sinks", what: str = "logit"
) -> Optional[np.ndarray]:
    """The sinks (or ALiBi slopes) as contiguous float32 (the library checks
    there is one per query head)."""
    if sinks is None:
        return None
    s = array(fn, name, sinks, kind)
    if kind == "torch":
        s = as_numpy(fn, name, s.float() if s.dtype != A.torch_module().float32 else s, kind)
    if s.ndim != 1:
        raise ValueError(f"{fn}: {name} has shape {s.shape}; expected one {what} per query head")
    return np.ascontiguousarray(s, dtype=A.F32)


def mask_options(
    fn: str,
    kind: str,
    attn_mask: Any,
    bias: Any,
    sinks: Any,
    full: Tuple[int, ...],
    what: str,
    **opts: Any,
) -> Tuple[Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray], Dict[str, Any]]:
    """(mask, bias, sinks as the core reads them, the request's options):
    masks() of attn_mask and bias to ``full`` (``what`` names its axes),
    sinks_array() of the sinks, and options() of opts, options()'s other
    keywords, their alibi_slopes the caller's (made float32 here)."""
    mask, bias4 = masks(fn, attn_mask, bias, kind, full, what)
    sinks1 = sinks_array(fn, sinks, kind)
    slopes = opts.pop("alibi_slopes", None)
    if slopes is not None:
        opts["alibi_slopes"] = sinks_array(fn, slopes, kind, "alibi_slopes", "slope")
    return mask, bias4, sinks1, options(fn, mask=mask, bias=bias4, sinks=sinks1, **opts)


def _number(fn: str, name: str, x: Any) -> float:
    """A real number: a Python, numpy or 0-d torch number (a string, a bool,
    None or a sequence is a TypeError, never read as a number)."""
    if x is None or isinstance(x, (str, bytes, bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a real number, not {type(x).__name__} {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(
            f"{fn}: {name} must be a real number, not {type(x).__name__} {x!r}"
        ) from None


def _integer(fn: str, name: str, x: Any) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{fn}: {name} must be an int, not {type(x).__name__} {x!r}")
    return int(x)


def _pair(fn: str, name: str, x: Any, form: str) -> Tuple[Any, Any]:
    try:
        a, b = x
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: {name} must be a pair {form}, got {x!r}") from None
    return a, b


def options(
    fn: str,
    *,
    scale: Any = None,
    causal: Any = False,
    window: Any = (-1, -1),
    softcap: Any = 0.0,
    kv_range: Any = None,
    precise: Any = False,
    mask: Optional[np.ndarray] = None,
    bias: Optional[np.ndarray] = None,
    sinks: Optional[np.ndarray] = None,
    top_left: bool = False,
    unit_weights: Any = None,
    batch_invariant: Any = False,
    alibi_slopes: Optional[np.ndarray] = None,
) -> Dict[str, Any]:
    """The options dict of the core's request. Values are only converted
    (types); the library checks them (scale finite and > 0, window >= -1,
    softcap finite and >= 0, the key range) and names `fn` in its message.
    A bound the core's unsigned fields cannot hold (a negative kv_range
    bound) is refused here. top_left: torch's is_causal (query i at position
    i, key j at j). unit_weights: "rounded" or "split" (how the weights
    enter the bfloat16 units' P V product; None: "rounded")."""
    # None: not set (1/sqrt(E)); a NaN is the library's error, as any scale
    # that is not finite and > 0.
    sc = None if scale is None else _number(fn, "scale", scale)
    o: Dict[str, Any] = {
        "scale": sc,
        "causal": bool(causal),
        "softcap": _number(fn, "softcap", softcap),
        "precise": bool(precise),
        "batch_invariant": bool(batch_invariant),
        "alibi_slopes": alibi_slopes,
        "mask": mask,
        "bias": bias,
        "sinks": sinks,
    }
    if unit_weights is not None and unit_weights != "rounded":
        if not isinstance(unit_weights, str):
            raise TypeError(
                f"{fn}: unit_weights must be 'rounded' or 'split', not {unit_weights!r}"
            )
        o["unit_weights"] = unit_weights
    wl, wr = _pair(fn, "window", window, "(left, right) of ints")
    o["window_left"], o["window_right"] = _integer(fn, "window", wl), _integer(fn, "window", wr)
    if kv_range is not None:
        b, e = _pair(fn, "kv_range", kv_range, "(begin, end)")
        b = _integer(fn, "kv_range", b)
        e = None if e is None else _integer(fn, "kv_range", e)
        if b < 0 or (e is not None and e < 0):
            raise ValueError(f"{fn}: kv_range {tuple(kv_range)!r} has a negative bound")
        o["kv_begin"], o["kv_end"] = b, e
    if top_left:
        o["q_position"], o["kv_position"] = 0, 0
    return o


def torch_aliases(
    fn: str, causal: Any, is_causal: Any, enable_gqa: Any, dropout_p: Any
) -> Tuple[bool, bool]:
    """(causal, top_left) from softdot's causal and torch's keywords:
    is_causal is torch's top-left causal mask, enable_gqa is always on
    here, dropout_p must be 0 (attention here is the exact function)."""
    if _number(fn, "dropout_p", dropout_p) != 0.0:
        raise ValueError(
            f"{fn}: dropout_p must be 0 (softdot computes attention without dropout), "
            f"got {dropout_p!r}"
        )
    del enable_gqa  # grouped-query heads are always enabled
    if is_causal and causal:
        raise ValueError(
            f"{fn}: pass causal= (bottom-right aligned) or is_causal= (torch's, top-left), not both"
        )
    if is_causal:
        return True, True
    return bool(causal), False


class Prepared:
    """The contiguous K/V request's pieces: the query's kind, 4-d views of
    q, k, v (and int8 scales), the source dict, the caller's shapes, and the
    arrays to check `out` against."""

    __slots__ = (
        "kind",
        "q",
        "kv",
        "lead",
        "L",
        "S",
        "Ev",
        "hq",
        "raw",
        "scales",
        "q_format",
        "q_dtype",
    )

    kind: str
    q: np.ndarray
    kv: Dict[str, Any]
    lead: Tuple[int, ...]
    L: int
    S: int
    Ev: int
    hq: int
    raw: List[Tuple[str, Optional[np.ndarray]]]
    scales: List[Tuple[str, np.ndarray]]
    q_format: int
    q_dtype: Any


def prepare(
    fn: str, query_: Any, key: Any, value: Any, kv_scales: Tuple[Any, Any] = (None, None)
) -> Prepared:
    """The query and a contiguous K/V source (value None: keys only, for
    weights and scores) from a call's arrays; kv_scales: an fp8 key's and
    value's k_scale / v_scale (fp8_scale)."""
    p = Prepared()
    kind = A.kind_of(query_)
    p.kind = kind
    q, p.q_format, p.q_dtype = query(fn, query_, kind)

    def kv(name: str, a: Any) -> Tuple[np.ndarray, int, Optional[np.ndarray]]:
        """(array, format, scales): an int8 (values, scales) pair or one array."""
        pair = _int8.int8_kv(fn, name, a, kind)
        if pair is not None:
            return pair[0], KV_I8, pair[1]
        arr, fmt = kv_format(fn, name, array(fn, name, a, kind), kind)
        return arr, fmt, None

    k, fk, ks = kv("key", key)
    v = vsc = None
    if value is not None:
        v, fv, vsc = kv("value", value)
        if fk != fv:
            raise TypeError(
                f"{fn}: key has dtype {KV_NAMES[fk]} but value has dtype "
                f"{KV_NAMES[fv]}; they must be the same"
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
    if E == 0 or (v is not None and v.shape[-1] == 0):
        raise ValueError(f"{fn}: query {q.shape}{vs}: E and Ev must be >= 1")
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
    p.lead, p.L, p.S, p.hq = qb, L, S, hq
    p.Ev = v.shape[-1] if v is not None else 0
    p.q = ready(to4(q))
    p.kv = {"format": fk, "k": ready(to4(k)), "v": None if v is None else ready(to4(v))}
    if ks is not None:
        p.kv["k_scales"] = _int8.ready_scales(ready(to4(ks)))
    if vsc is not None:
        p.kv["v_scales"] = _int8.ready_scales(ready(to4(vsc)))
    for name, sc, a, core in (("k_scale", kv_scales[0], k, "k"), ("v_scale", kv_scales[1], v, "v")):
        if a is None:
            continue
        tensor, per_token = fp8_scale(fn, name, sc, fk, a.shape, kind)
        if per_token is not None:
            p.kv[f"{core}_scales"] = ready(to4(per_token))
            p.raw.append((name, per_token))
        elif tensor is not None:
            p.kv[f"{core}_scale"] = tensor
    return p


def terms(p: Prepared) -> T.Terms:
    """The core's q, k, v of a prepared call in the caller's terms (its
    argument names, shapes and indices)."""
    t = T.Terms()
    core = {"query": ("q", p.q), "key": ("k", p.kv["k"]), "value": ("v", p.kv["v"])}
    for name, a in p.raw:
        if a is not None and name in core and core[name][1] is not None:
            c, view = core[name]
            t.add(c, name, a.shape, view.shape, T.caller_index(a.shape))
    return t


def check_out_overlap(fn: str, o: np.ndarray, arrays: List[Tuple[str, Any]]) -> None:
    for name, a in arrays:
        A.check_overlap(fn, o, name, a, False)


def target(o: np.ndarray) -> Tuple[np.ndarray, bool]:
    """(4-d array the core writes, whether it is o's memory)."""
    o4 = to4(o)
    direct = (
        A.row_contiguous(o4)
        and all(s >= 0 for s in o4.strides)
        and (o.ndim <= 4 or bool(np.shares_memory(o4, o)))
    )
    return (o4, True) if direct else (np.empty(o4.shape, o.dtype), False)


def run(
    fn: str,
    q4: np.ndarray,
    kv: Dict[str, Any],
    kind: str,
    out4: Optional[np.ndarray],
    lse: Optional[np.ndarray],
    opts: Dict[str, Any],
    scales: List[Tuple[str, np.ndarray]],
    q_format: int = KV_F32,
    out_format: int = KV_F32,
    caller: Optional[Callable[[], T.Terms]] = None,
    backward: Optional[Dict[str, Any]] = None,
    partial: Any = None,
) -> None:
    """The core's request: kind "output" (out4 and lse), "weights" or
    "scores" (out4), "partial" (into `partial`, an _core.AttentionPartial)
    or "gradients" (`backward`: the forward's out and lse, dout, dlse and
    the gradients' arrays dq, dk, dv, dbias, dsinks; out4 and lse None).
    q_format KV_F64: the double functions (kinds "output" and "gradients").
    A refused int8 scale is named by its index in the caller's array
    (scales: the caller's (name, scales) pairs); with `caller` (what builds
    the terms, called only on an error), every other message names the
    caller's arrays (terms())."""

    def core() -> None:
        _core.attention_request(
            fn, q4, q_format, kv, kind, out4, out_format, lse, opts, backward, partial
        )

    def call() -> None:
        if caller is None:
            core()
        else:
            T.run_in(caller, core)

    if scales:
        _int8.check_scales_on_error(fn, scales, call)
    else:
        call()


def empty_rows(
    shape: Tuple[int, ...],
    kind: str,
    out: Any,
    fn: str,
    q_format: int = KV_F32,
    q_dtype: Any = None,
) -> Tuple[Any, Any]:
    """The result of a call with no query rows (L = 0): an empty output of
    the right shape (out itself when given), as torch returns."""
    user = (
        A.output(fn, out, shape, A.F32, kind)[0]
        if q_format == KV_F32
        else (result(fn, out, shape, q_format, q_dtype, kind)[0])
    )
    return user, A.new_output(shape[:-1], A.F32, kind)[0]
