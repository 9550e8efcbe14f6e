"""One attention request with contiguous K/V from the caller's arrays (the
core of scaled_dot_product_attention, attention_weights and the autograd
forward, _attention_grad.py): the arrays prepared as the core's 4-d views,
the options, the output, the call (float64 inputs: the double path)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _arrays as A
from . import _request as R


class Arrays(NamedTuple):
    """The arrays of one call with contiguous K/V as the caller passed them
    (value None: keys only, for the weights)."""

    query: Any
    key: Any
    value: Any
    attn_mask: Any = None
    bias: Any = None
    sinks: Any = None


def call(fn: str, kind: str, arrays: Arrays, out: Any, return_lse: bool, **opts: Any) -> Any:
    """One request with contiguous K/V: kind "output" or "weights"."""
    query, key, value, attn_mask, bias, sinks = arrays
    kv_scales = (opts.pop("k_scale", None), opts.pop("v_scale", None))
    if kind == "output" and is_f64(query):
        if kv_scales != (None, None):
            raise ValueError(f"{fn}: k_scale and v_scale scale fp8 caches only, not float64 ones")
        return call_f64(fn, arrays, out, return_lse, **opts)
    slopes = opts.get("alibi_slopes")
    R.no_grad(fn, A.kind_of(query), query, key, value, attn_mask, bias, sinks, slopes)
    p = R.prepare(fn, query, key, value, kv_scales)
    full = p.lead + (p.L, p.S)
    mask, bias4, sinks1, o = R.mask_options(
        fn, p.kind, attn_mask, bias, sinks, full, "query's batch axes, L, S", **opts
    )
    shape = p.lead + (p.L, p.Ev if kind == "output" else p.S)
    if kind != "output" and p.q_format != R.KV_F32:
        raise TypeError(
            f"{fn}: query has dtype {R.KV_NAMES[p.q_format]}; the weights take a float32 query"
        )
    if p.L == 0:  # no query rows: an empty result, as torch gives
        user, lse_user = R.empty_rows(shape, p.kind, out, fn, p.q_format, p.q_dtype)
        return (user, lse_user) if return_lse else user
    if kind == "output":
        user, out_arr, out_format = R.result(fn, out, shape, p.q_format, p.q_dtype, p.kind)
    else:
        user, out_arr = A.output(fn, out, shape, A.F32, p.kind)
        out_format = R.KV_F32
    if out is not None:
        R.check_out_overlap(
            fn, out_arr, p.raw + [("attn_mask", mask), ("bias", bias4), ("sinks", sinks1)]
        )
    out4, direct = R.target(out_arr)
    lse_user, lse = A.new_output(p.lead + (p.L,), A.F32, p.kind) if return_lse else (None, None)
    R.run(fn, p.q, p.kv, kind, out4, lse, o, p.scales, p.q_format, out_format, lambda: R.terms(p))
    if not direct:
        np.copyto(out_arr, out4.reshape(shape))
    return (user, lse_user) if return_lse else user


def is_f64(a: Any) -> bool:
    dt = getattr(a, "dtype", None)
    return dt is not None and str(dt) in ("float64", "torch.float64")


def call_f64(fn: str, arrays: Arrays, out: Any, return_lse: bool, **opts: Any) -> Any:
    """float64 query, key and value: softdot::attention in double (plain
    loops: for gradient checks and float64 pipelines)."""
    query, key, value, attn_mask, bias, sinks = arrays
    kind = A.kind_of(query)
    if out is not None:
        raise ValueError(f"{fn}: out= is not taken with float64 inputs")
    arrs = []
    for name, a in (("query", query), ("key", key), ("value", value)):
        if not is_f64(a):
            got = getattr(a, "dtype", type(a))
            raise TypeError(f"{fn}: query is float64, so {name} must be float64 too (got {got})")
        x = a.detach().numpy() if kind == "torch" else np.asarray(a)
        if x.ndim < 2 or x.ndim != np.ndim(query):
            raise ValueError(
                f"{fn}: {name} has shape {x.shape}; expected [..., L, E] like the query"
            )
        arrs.append(np.ascontiguousarray(x))
    q, k, v = arrs
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"{fn}: query {q.shape}, key {k.shape}, value {v.shape}: "
            f"the batch axes and S must match"
        )
    L, S = q.shape[-2], k.shape[-2]
    full = tuple(q.shape[:-2]) + (L, S)
    _, _, _, o = R.mask_options(
        fn, kind, attn_mask, bias, sinks, full, "query's batch axes, L, S", **opts
    )
    q4, k4, v4 = R.to4(q), R.to4(k), R.to4(v)
    res = np.empty(q4.shape[:-1] + (v4.shape[-1],), np.float64)
    lse = np.empty(q4.shape[:-1], np.float64)
    kv = {"format": R.KV_F64, "k": k4, "v": v4}
    R.run(fn, q4, kv, "output", res, lse.reshape(-1), o, [], R.KV_F64, R.KV_F64)
    res = res.reshape(q.shape[:-1] + (v.shape[-1],))
    lse = lse.reshape(q.shape[:-1])
    if kind == "torch":
        torch = A.torch_module()
        res, lse = torch.from_numpy(res), torch.from_numpy(lse)
    return (res, lse) if return_lse else res
