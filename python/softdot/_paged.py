"""Attention over a paged K/V cache (block table, per-sequence lengths), for
numpy arrays and CPU torch tensors. See docs/python.md."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _request as R

_I32 = np.dtype(np.int32)
_I8 = np.dtype(np.int8)


_PAGE_AXES = {"NHD": "[pages, page_size, H_kv, E]", "HND": "[pages, H_kv, page_size, E]"}


def _cache(fn: str, name: str, c: Any, kind: str, layout: str):
    """(pages [P, H_kv, page_size, E] as the core reads them, scales
    [P, H_kv, page_size, 1] or None, format code, the caller's arrays)."""
    if isinstance(c, tuple):
        if len(c) != 2:
            raise TypeError(f"{fn}: {name} as a tuple must be (values, scales) of an int8 cache")
        vals = R.array(fn, f"{name} values", c[0], kind)
        sc = R.array(fn, f"{name} scales", c[1], kind)
        if A.dtype_str(vals) != "int8":
            raise A.accepted(fn, f"{name} values", vals, "int8")
        if A.dtype_str(sc) != "float32":
            raise A.accepted(fn, f"{name} scales", sc, "float32")
        vals = R.as_numpy(fn, f"{name} values", vals, kind)
        sc = R.as_numpy(fn, f"{name} scales", sc, kind)
        if vals.ndim != 4:
            raise ValueError(
                f"{fn}: {name} values has shape {vals.shape}; expected 4 axes {_PAGE_AXES[layout]}"
            )
        if sc.shape == vals.shape[:-1]:
            sc = sc[..., None]
        elif sc.shape != vals.shape[:-1] + (1,):
            raise ValueError(
                f"{fn}: {name} scales has shape {sc.shape}; expected "
                f"{vals.shape[:-1]} (one per token and head of {vals.shape})"
            )
        raw = [(f"{name} values", vals), (f"{name} scales", sc)]
        if layout == "NHD":
            vals, sc = vals.transpose(0, 2, 1, 3), sc.transpose(0, 2, 1, 3)
        return R.ready(vals), R.ready(sc), R.KV_I8, raw
    a, fmt = R.kv_format(fn, name, R.array(fn, name, c, kind), kind)
    if a.ndim != 4:
        raise ValueError(f"{fn}: {name} has shape {a.shape}; expected 4 axes {_PAGE_AXES[layout]}")
    raw = [(name, a)]
    if layout == "NHD":
        a = a.transpose(0, 2, 1, 3)
    return R.ready(a), None, fmt, raw


def _int32(fn: str, name: str, a: Any, kind: str, ndim: int) -> np.ndarray:
    """An integer table as C-contiguous int32 (a copy only when it is not
    one already)."""
    a = R.as_numpy(fn, name, R.array(fn, name, a, kind), kind)
    if a.dtype.kind not in "iu":
        raise A.accepted(fn, name, a, "int32 (or another integer dtype, converted)")
    if a.ndim != ndim:
        raise ValueError(f"{fn}: {name} has shape {a.shape}; expected {ndim} axes")
    if a.dtype != _I32:
        if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
            raise ValueError(f"{fn}: {name} holds values outside int32")
        a = a.astype(_I32)
    return np.ascontiguousarray(a)


def paged_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    attn_mask: Any = None,
    bias: Any = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    kv_range: Optional[Tuple[int, Optional[int]]] = None,
    kv_layout: str = "NHD",
    return_lse: bool = False,
    out: Any = None,
    unit_weights: str = "rounded",
) -> Any:
    """Fused attention over a paged K/V cache, as LLM serving engines keep
    it: sequence b's key position t lies in page
    ``block_table[b, t // page_size]``, row ``t % page_size``, for
    ``t < seq_lens[b]``. Each sequence's result is, bit for bit, that of
    :func:`scaled_dot_product_attention` on its keys gathered in order
    (contiguous), with n_kv = seq_lens[b].

    Parameters
    ----------
    query : array [B, Hq, L, E]; float32, float16 or bfloat16 (the output
        takes its dtype; bfloat16 with a bfloat16 cache runs the prefill
        products on the bfloat16 units, as scaled_dot_product_attention)
        Query i of L sits at key position ``i + seq_lens[b] - L`` (decode:
        L = 1; chunked prefill: L new tokens at the end of the cache).
    key_cache, value_cache : arrays [P, page_size, Hkv, E] (``kv_layout``
        "NHD", vLLM's and flash-attn's) or [P, Hkv, page_size, E] ("HND");
        float32, float16 or bfloat16, read in place (no copy); or an int8
        cache as a tuple ``(values, scales)``: int8 values of that shape and
        float32 scales [P, page_size, Hkv] (or with a trailing 1; "HND":
        [P, Hkv, page_size]), value = scale * int8 rounded once to float.
        Hq must be a multiple of Hkv.
    block_table : int32 array [B, blocks_per_seq]
        Page indices; entries past a sequence's last page are never read
        (-1 padding is fine). Other integer dtypes are converted (a copy of
        the table only).
    seq_lens : int32 array [B]
        Keys of each sequence (0 allowed: zero rows, lse -inf).
    attn_mask, bias : arrays broadcastable to [B, Hq, L, S], optional
        Columns are key positions; S must be at least max(seq_lens). bool
        mask: True = attend; a float mask is added, as ``bias`` is.
    scale, causal, window, softcap, sinks : as for
        :func:`scaled_dot_product_attention`, per sequence.
    kv_range : (begin, end), optional
        Keys begin <= t < end of each sequence, both clamped to its length
        (a range past a sequence's end is empty for it).
    return_lse : bool, default False
        Also return lse [B, Hq, L].
    out : array [B, Hq, L, Ev], optional; the query's dtype or float32
    unit_weights : "rounded" or "split"; see scaled_dot_product_attention

    Returns
    -------
    out, or (out, lse)

    Bad tables (a page index out of range or negative, a length longer than
    its blocks hold, a table of the wrong size) raise ValueError naming the
    sequence and the entry; nothing is read out of bounds and nothing is
    written. The GIL is released.
    """
    fn = "paged_attention"
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"{fn}: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    kind = A.kind_of(query)
    R.no_grad(
        fn,
        kind,
        query,
        attn_mask,
        bias,
        sinks,
        *(key_cache if isinstance(key_cache, tuple) else (key_cache,)),
        *(value_cache if isinstance(value_cache, tuple) else (value_cache,)),
    )
    q, q_format, q_dtype = R.query(fn, query, kind)
    if q.ndim != 4:
        raise ValueError(f"{fn}: query has shape {q.shape}; expected [B, Hq, L, E]")
    k, ks, fk, raw_k = _cache(fn, "key_cache", key_cache, kind, kv_layout)
    v, vs, fv, raw_v = _cache(fn, "value_cache", value_cache, kind, kv_layout)
    if fk != fv:
        raise TypeError(
            f"{fn}: key_cache and value_cache must have the same dtype "
            f"(int8 caches: both (values, scales) tuples)"
        )
    B, Hq, L, E = q.shape
    bt = _int32(fn, "block_table", block_table, kind, 2)
    sl = _int32(fn, "seq_lens", seq_lens, kind, 1)
    if bt.shape[0] != B or sl.shape[0] != B:
        raise ValueError(
            f"{fn}: block_table has shape {bt.shape} and seq_lens {sl.shape}; "
            f"both need B = {B} rows (query {q.shape})"
        )
    S = max(int(sl.max()), 0) if sl.size else 0
    Ev = v.shape[-1]
    # Mask and bias columns are key positions: as many as the caller gives
    # (at least max(seq_lens), which the library checks).
    cols = [a.shape[-1] for a in (attn_mask, bias) if a is not None and getattr(a, "ndim", False)]
    mask, bias4 = R.masks(
        fn, attn_mask, bias, kind, (B, Hq, L, max(cols) if cols else S), "B, Hq, L, key positions"
    )
    sk = R.sinks_array(fn, sinks, kind)
    opts = R.options(
        fn,
        scale=scale,
        causal=causal,
        window=window,
        softcap=softcap,
        kv_range=kv_range,
        mask=mask,
        bias=bias4,
        sinks=sk,
        unit_weights=unit_weights,
    )
    shape = (B, Hq, L, Ev)
    if L == 0:  # no query rows: an empty result, as torch gives
        user, lse_user = R.empty_rows(shape, kind, out, fn, q_format, q_dtype)
        return (user, lse_user) if return_lse else user
    user, o, out_format = R.result(fn, out, shape, q_format, q_dtype, kind)
    if out is not None:
        R.check_out_overlap(
            fn,
            o,
            [("query", q)]
            + raw_k
            + raw_v
            + [
                ("attn_mask", mask),
                ("bias", bias4),
                ("sinks", sk),
                ("block_table", bt),
                ("seq_lens", sl),
            ],
        )
    out4, direct = R.target(o)
    lse_user, lse = A.new_output((B, Hq, L), A.F32, kind) if return_lse else (None, None)
    kv = {
        "format": fk,
        "k": k,
        "v": v,
        "k_name": "key_cache",
        "v_name": "value_cache",
        "block_table": bt.reshape(-1),
        "blocks_per_seq": bt.shape[1],
        "seq_lens": sl,
    }
    if ks is not None:
        kv["k_scales"], kv["v_scales"] = ks, vs
    # The library names a bad scale by page, head, row, sequence and position
    # (only the scales a key reads are checked; unused pages may hold anything).
    R.run(fn, R.ready(q), kv, "output", out4, lse, opts, [], q_format, out_format)
    if not direct:
        np.copyto(o, out4.reshape(shape))
    return (user, lse_user) if return_lse else user


paged_attention.__doc__ = (paged_attention.__doc__ or "") + R.CAUSAL_DOC
