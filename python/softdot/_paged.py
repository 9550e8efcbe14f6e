"""Attention over a paged K/V cache (block table, per-sequence lengths), for
numpy arrays and CPU torch tensors. See docs/python.md."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _request as R
from . import _softdot as _core
from . import _terms as T

_I32 = np.dtype(np.int32)
_I8 = np.dtype(np.int8)


_PAGE_AXES = {"NHD": "[pages, page_size, H_kv, E]", "HND": "[pages, H_kv, page_size, E]"}


def _int64(fn: str, name: str, a: Any, kind: str) -> np.ndarray:
    """A 1-d integer array as C-contiguous int64."""
    a = R.as_numpy(fn, name, R.array(fn, name, a, kind), kind)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise ValueError(f"{fn}: {name} must be a 1-d integer array, got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _in_place(fn: str, name: str, a: np.ndarray) -> np.ndarray:
    """a itself, for the core to write: writable, contiguous last axis,
    non-negative strides (a copy would leave the caller's cache unchanged)."""
    if not a.flags.writeable:
        raise ValueError(f"{fn}: {name} is read-only; the cache is written in place")
    if not A.row_contiguous(a) or any(s < 0 for s in a.strides):
        raise ValueError(
            f"{fn}: {name} (strides {a.strides}) must have a contiguous last axis and "
            "non-negative strides to be written in place"
        )
    return a


def _cache(fn: str, name: str, c: Any, kind: str, layout: str, write: bool = False):
    """(pages [P, H_kv, page_size, E] as the core reads them, scales
    [P, H_kv, page_size, 1] or None, format code, the caller's arrays);
    write: views of the caller's memory, never copies."""
    ready = (lambda a, n: _in_place(fn, n, a)) if write else (lambda a, n: R.ready(a))
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
        return ready(vals, f"{name} values"), ready(sc, f"{name} scales"), R.KV_I8, raw
    a, fmt = R.kv_format(fn, name, R.array(fn, name, c, kind), kind)
    if a.ndim != 4:
        raise ValueError(f"{fn}: {name} has shape {a.shape}; expected 4 axes {_PAGE_AXES[layout]}")
    raw = [(name, a)]
    if layout == "NHD":
        a = a.transpose(0, 2, 1, 3)
    return ready(a, name), None, fmt, raw


def _cache_terms(terms: T.Terms, core: str, raw: Any, pages: np.ndarray, layout: str) -> None:
    """The core's k_pages / v_pages (and an int8 cache's scales) in the
    caller's terms: the name, the shape and the axis order of kv_layout."""
    f = T.pages_nhd if layout == "NHD" else T.same
    names = {1: [core], 2: [core, core.replace("pages", "scales")]}[len(raw)]
    for c, (name, a) in zip(names, raw):
        shape = a.shape if layout == "HND" else (a.shape[0], a.shape[2], a.shape[1], a.shape[3])
        terms.add(c, name, a.shape, shape, f)


def _layout_hint(fn: str, raw: Any, layout: str, q_heads: int, e: int) -> Optional[str]:
    """When the caller's pages fit the other layout's reading (its KV heads
    divide the query's heads and the head dim matches) but not this one's:
    the hint that names kv_layout."""
    shape = raw[0][1].shape
    heads = {"NHD": shape[2], "HND": shape[1]}
    other = "HND" if layout == "NHD" else "NHD"
    fits = {lay: h > 0 and q_heads % h == 0 and shape[3] == e for lay, h in heads.items()}
    if fits[layout] or not fits[other]:
        return None
    return (
        f"(kv_layout={layout!r} reads {raw[0][0]} {tuple(shape)} as "
        f"{_PAGE_AXES[layout]}, {heads[layout]} KV heads; with kv_layout={other!r} it has "
        f"{heads[other]} KV heads, which fits the query's {q_heads})"
    )


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


def _layout(fn: str, kv_layout: Any) -> None:
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"{fn}: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")


def _caches(
    fn: str,
    key_cache: Any,
    value_cache: Any,
    kind: str,
    layout: str,
    write: bool,
    scales: Tuple[Any, Any] = (None, None),
) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
    """_cache of key_cache and of value_cache, which must share a format,
    each with a fifth item: an fp8 cache's per-tensor scale (else None). An
    fp8 cache's per-token scales (k_scale= / v_scale= arrays) take the int8
    scales' place (item 1, their caller's array added to item 3)."""
    kc = _cache(fn, "key_cache", key_cache, kind, layout, write=write)
    vc = _cache(fn, "value_cache", value_cache, kind, layout, write=write)
    if kc[2] != vc[2]:
        raise TypeError(
            f"{fn}: key_cache and value_cache must have the same dtype "
            f"(int8 caches: both (values, scales) tuples)"
        )
    out = []
    for c, name, sc in ((kc, "k_scale", scales[0]), (vc, "v_scale", scales[1])):
        tensor, per_token = R.fp8_scale(fn, name, sc, c[2], c[3][0][1].shape, kind)
        if per_token is None:
            out.append(c + (tensor,))
            continue
        raw = c[3] + [(name, per_token)]
        if layout == "NHD":
            per_token = per_token.transpose(0, 2, 1, 3)
        ready = _in_place(fn, name, per_token) if write else R.ready(per_token)
        out.append((c[0], ready, c[2], raw, None))
    return out[0], out[1]


def _query(
    fn: str, query: Any, kind: str, query_start_loc: Any, attn_mask: Any, bias: Any
) -> Tuple[np.ndarray, int, Any, Tuple[int, ...], Optional[np.ndarray]]:
    """(the query as the core reads it, [B, Hq, L, E]; its format and dtype;
    the caller's shape; query_start_loc as int32, None for a batch of equal
    lengths). A ragged batch's packed [T, Hq, E] is read as [1, Hq, T, E]."""
    q, q_format, q_dtype = R.query(fn, query, kind)
    query_shape = tuple(q.shape)
    qsl = None
    if query_start_loc is not None:
        if q.ndim != 3:
            raise ValueError(
                f"{fn}: query has shape {q.shape}; with query_start_loc expected "
                "[T, Hq, E] (every sequence's rows one after another)"
            )
        if attn_mask is not None or bias is not None:
            raise ValueError(f"{fn}: a ragged batch (query_start_loc) takes no attn_mask or bias")
        qsl = _int32(fn, "query_start_loc", query_start_loc, kind, 1)
        q = q.transpose(1, 0, 2)[None]  # [1, Hq, T, E], a view
    elif q.ndim != 4:
        raise ValueError(f"{fn}: query has shape {q.shape}; expected [B, Hq, L, E]")
    return q, q_format, q_dtype, query_shape, qsl


def _tables(
    fn: str,
    block_table: Any,
    seq_lens: Any,
    kind: str,
    qsl: Optional[np.ndarray],
    q_shape: Tuple[int, ...],
) -> Tuple[np.ndarray, np.ndarray, int]:
    """(block_table and seq_lens as int32, the number of sequences B), their
    rows checked against the query's (a ragged batch: query_start_loc's)."""
    bt = _int32(fn, "block_table", block_table, kind, 2)
    sl = _int32(fn, "seq_lens", seq_lens, kind, 1)
    B = q_shape[0]
    if qsl is not None:
        B = sl.shape[0]
        if qsl.shape[0] != B + 1 or bt.shape[0] != B:
            raise ValueError(
                f"{fn}: query_start_loc has shape {qsl.shape}, block_table {bt.shape} and "
                f"seq_lens {sl.shape}; they need B + 1, B and B rows"
            )
    elif bt.shape[0] != B or sl.shape[0] != B:
        raise ValueError(
            f"{fn}: block_table has shape {bt.shape} and seq_lens {sl.shape}; "
            f"both need B = {B} rows (query {q_shape})"
        )
    return bt, sl, B


def _options(
    fn: str,
    kind: str,
    rows: Tuple[int, int, int],
    sl: np.ndarray,
    arrays: Tuple[Any, Any, Any],
    flags: Dict[str, Any],
) -> Tuple[Any, Any, Any, Dict[str, Any]]:
    """R.mask_options for rows (B, Hq, L) and arrays (attn_mask, bias,
    sinks); flags: R.options's other keywords. Mask and bias columns are key
    positions: as many as the caller gives (at least max(seq_lens), which
    the library checks)."""
    S = max(int(sl.max()), 0) if sl.size else 0
    cols = [a.shape[-1] for a in arrays[:2] if a is not None and getattr(a, "ndim", False)]
    full = rows + (max(cols) if cols else S,)
    return R.mask_options(fn, kind, *arrays, full, "B, Hq, L, key positions", **flags)


def _no_rows(
    fn: str,
    qsl: Optional[np.ndarray],
    shape: Tuple[int, ...],
    lse_shape: Tuple[int, ...],
    kind: str,
    out: Any,
    q_format: int,
    q_dtype: Any,
    return_lse: bool,
) -> Any:
    """paged_attention's result for a query of no rows: an empty result, as
    torch gives."""
    if qsl is not None and qsl.any():
        raise ValueError(
            f"{fn}: query_start_loc {qsl.tolist()} claims rows the empty query [0, Hq, E] lacks"
        )
    user, lse_user = R.empty_rows(shape, kind, out, fn, q_format, q_dtype)
    if qsl is not None and return_lse:
        lse_user = A.new_output(lse_shape, A.F32, kind)[0]
    return (user, lse_user) if return_lse else user


def _outputs(
    fn: str,
    out: Any,
    shape: Tuple[int, ...],
    q_format: int,
    q_dtype: Any,
    kind: str,
    ragged: bool,
    inputs: List[Tuple[str, Any]],
) -> Tuple[Any, np.ndarray, np.ndarray, bool, int]:
    """(what the caller gets, the numpy array behind it, the [B, Hq, L, Ev]
    array the core writes, whether that is the caller's memory, its format).
    A ragged batch's output [T, Hq, Ev] is written as [1, Hq, T, Ev] through
    strides; out must share no memory with the inputs."""
    user, o, out_format = R.result(fn, out, shape, q_format, q_dtype, kind)
    if out is not None:
        R.check_out_overlap(fn, o, inputs)
    if ragged:
        o4 = o.transpose(1, 0, 2)[None]
        direct = A.row_contiguous(o4) and all(s >= 0 for s in o4.strides)
        out4 = o4 if direct else np.empty(o4.shape, o.dtype)
    else:
        out4, direct = R.target(o)
    return user, o, out4, direct, out_format


def _kv(
    fn: str,
    kind: str,
    kc: Tuple[Any, ...],
    vc: Tuple[Any, ...],
    bt: np.ndarray,
    sl: np.ndarray,
    qsl: Optional[np.ndarray],
    draft_parents: Any,
    positions: Tuple[Any, Any, int],
) -> Dict[str, Any]:
    """The request's K/V: the pages, the tables and the positions
    (query_positions, kv_position_offsets, kv_position_stride)."""
    query_positions, kv_position_offsets, kv_position_stride = positions
    kv = {
        "format": kc[2],
        "k": kc[0],
        "v": vc[0],
        "k_name": "key_cache",
        "v_name": "value_cache",
        "block_table": bt.reshape(-1),
        "blocks_per_seq": bt.shape[1],
        "seq_lens": sl,
    }
    if qsl is not None:
        kv["query_start_loc"] = qsl
    if draft_parents is not None:
        dp = _int32(fn, "draft_parents", draft_parents, kind, 1 if qsl is not None else 2)
        kv["draft_parents"] = dp.reshape(-1)
    if query_positions is not None:
        kv["query_positions"] = _int64(fn, "query_positions", query_positions, kind)
        if kv_position_offsets is not None:
            kv["kv_position_offsets"] = _int64(fn, "kv_position_offsets", kv_position_offsets, kind)
        kv["kv_position_stride"] = int(kv_position_stride)
    elif kv_position_offsets is not None or kv_position_stride != 1:
        raise ValueError(f"{fn}: kv_position_offsets and kv_position_stride need query_positions")
    if kc[1] is not None:
        kv["k_scales"], kv["v_scales"] = kc[1], vc[1]
    if kc[4] is not None:  # fp8, per tensor
        kv["k_scale"], kv["v_scale"] = kc[4], vc[4]
    return kv


def _terms(
    fn: str,
    query_shape: Tuple[int, ...],
    q: np.ndarray,
    ragged: bool,
    kc: Tuple[Any, ...],
    vc: Tuple[Any, ...],
    layout: str,
) -> T.Terms:
    """The core's messages in the caller's terms (names, shapes, axis order)."""
    terms = T.Terms()
    terms.add("q", "query", query_shape, q.shape, T.tokens_heads if ragged else T.same)
    _cache_terms(terms, "k_pages", kc[3], kc[0], layout)
    _cache_terms(terms, "v_pages", vc[3], vc[0], layout)
    terms.hint(_layout_hint(fn, kc[3], layout, q.shape[1], q.shape[3]))
    return terms


def _write_and_attend(
    fn: str,
    kv_write: Any,
    kind: str,
    kc: Any,
    vc: Any,
    layout: str,
    terms: Callable[[], T.Terms],
    req: Tuple[Any, ...],
) -> None:
    """kv_write then the attention, in one core call (write_kv_and_attend:
    everything the write checks is checked before anything is written, and
    if the attention fails the rows written are put back, bit for bit)."""
    try:
        key, value, slot_mapping = kv_write
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: kv_write must be (key, value, slot_mapping)") from None
    args, write_terms = _write_args(fn, key, value, slot_mapping, kind, kc, vc, layout)

    def all_terms() -> T.Terms:
        t = terms()
        t.items += [x for x in write_terms().items if x[0] in ("key", "value")]
        return t

    q, q_format, kv, out4, out_format, lse, opts = req
    k, v, fk, kp, vp, fp, ks, vs, sm, k_scale, v_scale = args
    T.run_in(
        all_terms,
        lambda: _core.write_kv_and_attend(
            fn,
            k,
            v,
            fk,
            kp,
            vp,
            fp,
            ks,
            vs,
            sm,
            R.ready(q),
            q_format,
            kv,
            out4,
            out_format,
            lse,
            opts,
            k_scale=k_scale,
            v_scale=v_scale,
        ),
    )


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
    query_start_loc: Any = None,
    query_positions: Any = None,
    kv_position_offsets: Any = None,
    kv_position_stride: int = 1,
    batch_invariant: bool = False,
    draft_parents: Any = None,
    alibi_slopes: Any = None,
    kv_write: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
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
        With ``query_start_loc``: the packed form [T, Hq, E] that serving
        engines pass (flash-attn's varlen layout), every sequence's rows
        one after another.
    key_cache, value_cache : arrays [P, page_size, Hkv, E] (``kv_layout``
        "NHD", vLLM's and flash-attn's) or [P, Hkv, page_size, E] ("HND");
        float32, float16 or bfloat16, read in place (no copy); or an int8
        cache as a tuple ``(values, scales)``: int8 values of that shape and
        float32 scales [P, page_size, Hkv] (or with a trailing 1; "HND":
        [P, Hkv, page_size]), value = scale * int8 rounded once to float;
        or an fp8 cache (torch.float8_e4m3fn / float8_e5m2, ml_dtypes'
        float8 types for numpy) with ``k_scale`` / ``v_scale``.
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
    query_start_loc : int32 array [B + 1], optional
        A ragged batch (vLLM's ``query_start_loc``, flash-attn's
        ``cu_seqlens_q``): sequence b's query rows are rows
        ``query_start_loc[b]`` to ``query_start_loc[b + 1] - 1`` of the
        packed query (0 first, non-decreasing, T last), each sequence with
        its own row count L_b (prefill chunks, decode rows and verification
        rows in one call; its row i at position ``i + seq_lens[b] - L_b``).
        The output is [T, Hq, Ev] and lse [Hq, T]; each sequence's rows are
        bit for bit those of the call on that sequence alone. No mask or
        bias in this form.
    query_positions, kv_position_offsets : int64 arrays [B], optional
    kv_position_stride : int, default 1
        Positions of a cache sharded by position (decode context
        parallelism: key c of rank r of P at global position c P + r):
        sequence b's query row i sits at ``query_positions[b] + i`` and its
        key j at ``j * kv_position_stride + kv_position_offsets[b]``; causal
        and the window compare these. Each rank's result with
        ``return_lse=True`` merges with the others' (:func:`attention_merge`)
        into the attention over the whole cache.
    batch_invariant : bool, default False
        Every row computed in the decode form with its keys in chunks of 512
        at fixed key indices (see :func:`scaled_dot_product_attention`): a
        token's bits are the same whatever its batch companions, wherever a
        chunked prefill cut its prompt, and whether it is a prefill, decode
        or verification row, with decode at its usual speed.
    draft_parents : int32 array, optional
        A draft tree per sequence (speculative verification): one entry per
        query row ([T] with ``query_start_loc``, else [B, L]), the row of its
        parent within its sequence (an earlier row), or -1 for a token that
        follows the cached prefix. A sequence's L rows are draft tokens whose
        keys are its last L keys (row i's at ``seq_lens[b] - L + i``): row i
        sees the prefix and its ancestors' keys and its own, no other draft
        key. Not with ``attn_mask``, ``bias`` or ``query_positions``.
    kv_write : (key, value, slot_mapping), optional
        Write and attend in one call: :func:`write_kv` of these rows into
        ``key_cache`` and ``value_cache`` first (the step's new tokens), then
        the attention over the caches holding them. Everything the write
        checks is checked before anything is written; if the attention then
        raises (a bad table, say), the rows written are put back as they
        were, bit for bit, so a failed call leaves the cache unchanged. The
        caches must be writable in place, as for :func:`write_kv`.
    alibi_slopes : float32 array [Hq], optional
        ALiBi slopes, as :func:`scaled_dot_product_attention` (vLLM's
        ``alibi_slopes``): ``slope * (pos_j - pos_i)`` with each sequence's
        positions.

    Returns
    -------
    out, or (out, lse)

    k_scale, v_scale : float or float32 array, optional (fp8 caches only)
        vLLM's per-tensor scales (a float, default 1.0) or SGLang's per token
        and head (an array of the pages' shape without E, or with a trailing
        1): element value = scale * fp8 value rounded once to float32, and the
        result that of the float32 cache holding those values, bit for bit.

    Bad tables (a page index out of range or negative, a length longer than
    its blocks hold, a table of the wrong size) raise ValueError naming the
    sequence and the entry; nothing is read out of bounds and nothing is
    written. The GIL is released.
    """
    fn = "paged_attention"
    _layout(fn, kv_layout)
    kind = A.kind_of(query)
    caches = [x for c in (key_cache, value_cache) for x in (c if isinstance(c, tuple) else (c,))]
    R.no_grad(fn, kind, query, attn_mask, bias, sinks, alibi_slopes, *caches)
    q, q_format, q_dtype, query_shape, qsl = _query(
        fn, query, kind, query_start_loc, attn_mask, bias
    )
    ragged = qsl is not None
    # With kv_write the attention must read the caller's memory (the rows
    # just written), never a copy.
    kc, vc = _caches(
        fn, key_cache, value_cache, kind, kv_layout, kv_write is not None, (k_scale, v_scale)
    )
    bt, sl, B = _tables(fn, block_table, seq_lens, kind, qsl, q.shape)
    _, Hq, L, _ = q.shape
    flags: Dict[str, Any] = dict(scale=scale, causal=causal, window=window, softcap=softcap)
    flags.update(kv_range=kv_range, unit_weights=unit_weights, batch_invariant=batch_invariant)
    flags["alibi_slopes"] = alibi_slopes
    mask, bias4, sk, opts = _options(fn, kind, (B, Hq, L), sl, (attn_mask, bias, sinks), flags)
    # The ragged form's output is [T, Hq, Ev] (the core writes it as
    # [1, Hq, T, Ev] through strides) and its lse [Hq, T].
    Ev = vc[0].shape[-1]
    shape = (L, Hq, Ev) if ragged else (B, Hq, L, Ev)
    lse_shape = (Hq, L) if ragged else (B, Hq, L)
    if L == 0:  # no query rows: an empty result, as torch gives
        return _no_rows(fn, qsl, shape, lse_shape, kind, out, q_format, q_dtype, return_lse)
    inputs = [("query", q)] + kc[3] + vc[3] + [("attn_mask", mask), ("bias", bias4)]
    inputs += [("sinks", sk), ("block_table", bt), ("seq_lens", sl)]
    user, o, out4, direct, out_format = _outputs(
        fn, out, shape, q_format, q_dtype, kind, ragged, inputs
    )
    lse_user, lse = A.new_output(lse_shape, A.F32, kind) if return_lse else (None, None)
    positions = (query_positions, kv_position_offsets, kv_position_stride)
    kv = _kv(fn, kind, kc, vc, bt, sl, qsl, draft_parents, positions)

    def terms() -> T.Terms:
        return _terms(fn, query_shape, q, ragged, kc, vc, kv_layout)

    # The library names a bad scale by page, head, row, sequence and position
    # (only the scales a key reads are checked; unused pages may hold anything).
    if kv_write is None:
        R.run(fn, R.ready(q), kv, "output", out4, lse, opts, [], q_format, out_format, terms)
    else:
        _write_and_attend(
            fn,
            kv_write,
            kind,
            kc,
            vc,
            kv_layout,
            terms,
            (q, q_format, kv, out4, out_format, lse, opts),
        )
    if not direct:
        np.copyto(o, out4[0].transpose(1, 0, 2) if ragged else out4.reshape(shape))
    return (user, lse_user) if return_lse else user


paged_attention.__doc__ = (paged_attention.__doc__ or "") + R.CAUSAL_DOC


def _write_args(
    fn: str, key: Any, value: Any, slot_mapping: Any, kind: str, kc: Any, vc: Any, layout: str
) -> Tuple[Tuple[Any, ...], Callable[[], T.Terms]]:
    """The core's write_kv arguments (key, value, in_format, k_pages,
    v_pages, page_format, k_scales, v_scales, slot_mapping) from the new
    rows [T, Hkv, E] and _caches' pages (the caller's memory), and what
    builds the terms that name key, value and the pages in the caller's
    shapes (on an error only)."""
    k, fk = R.kv_format(fn, "key", R.array(fn, "key", key, kind), kind)
    v, fv = R.kv_format(fn, "value", R.array(fn, "value", value, kind), kind)
    if fk != fv:
        raise TypeError(f"{fn}: key and value must have the same dtype")
    for name, a in (("key", k), ("value", v)):
        if a.ndim != 3:
            raise ValueError(f"{fn}: {name} has shape {a.shape}; expected [T, Hkv, E]")
    sm = R.as_numpy(fn, "slot_mapping", R.array(fn, "slot_mapping", slot_mapping, kind), kind)
    if sm.dtype.kind not in "iu":
        raise A.accepted(fn, "slot_mapping", sm, "int64 (or another integer dtype, converted)")
    if sm.ndim != 1:
        raise ValueError(f"{fn}: slot_mapping has shape {sm.shape}; expected [T]")
    if sm.dtype.kind == "u" and sm.size and int(sm.max()) >= 2**63:
        raise ValueError(f"{fn}: slot_mapping holds values outside int64")
    sm = np.ascontiguousarray(sm, dtype=np.int64)

    def terms() -> T.Terms:
        t = T.Terms()
        for name, a in (("key", k), ("value", v)):
            t.add(name, name, a.shape, (1, a.shape[1], a.shape[0], a.shape[2]), T.tokens_heads)
        _cache_terms(t, "k_pages", kc[3], kc[0], layout)
        _cache_terms(t, "v_pages", vc[3], vc[0], layout)
        return t

    args = (
        R.ready(k.transpose(1, 0, 2)[None]),
        R.ready(v.transpose(1, 0, 2)[None]),
        fk,
        kc[0],
        vc[0],
        kc[2],
        kc[1],
        vc[1],
        sm,
        1.0 if kc[4] is None else kc[4],
        1.0 if vc[4] is None else vc[4],
    )
    return args, terms


def write_kv(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    *,
    kv_layout: str = "NHD",
    k_scale: Any = None,
    v_scale: Any = None,
) -> None:
    """Writes new keys and values into their slots of a paged cache, in
    place (vLLM's ``reshape_and_cache``): row t goes to slot
    ``slot_mapping[t] = page * page_size + row`` of every KV head; -1 skips
    the row.

    Parameters
    ----------
    key, value : arrays [T, Hkv, E] and [T, Hkv, Ev]; float32, float16 or
        bfloat16 (numpy with ``ml_dtypes.bfloat16``, or CPU torch tensors).
    key_cache, value_cache : the pages, as :func:`paged_attention` reads
        them ([P, page_size, Hkv, E] for ``kv_layout`` "NHD", else
        [P, Hkv, page_size, E]); float32, float16 or bfloat16 (a value the
        format cannot hold is rounded to nearest even), or int8 as
        ``(values, scales)``: each row of each head quantised as
        :func:`quantize_kv` does; or fp8 (torch.float8_e4m3fn / float8_e5m2,
        ml_dtypes' float8 types): with a per-tensor ``k_scale`` /
        ``v_scale`` (float) each value is written as value / scale rounded to
        nearest even, saturating at the format's largest value (448, 57344)
        as vLLM's and SGLang's caches do; with per-token scale arrays each
        row of each head gets scale = max |x| / 448 (57344), written there.
        Written in place: they must be writable with a contiguous last axis.
    slot_mapping : integer array [T] (int64; other integer dtypes are
        converted)

    k_scale, v_scale : float or float32 array, optional (fp8 caches only)

    A slot out of range, negative other than -1, or given to two rows, and
    for int8 and fp8 caches a row holding inf or NaN, raise ValueError naming the
    row and the slot; everything is checked before anything is written.
    The GIL is released.
    """
    fn = "write_kv"
    _layout(fn, kv_layout)
    kind = A.kind_of(key)
    kc, vc = _caches(fn, key_cache, value_cache, kind, kv_layout, True, (k_scale, v_scale))
    args, terms = _write_args(fn, key, value, slot_mapping, kind, kc, vc, kv_layout)
    k, v, fk, kp, vp, fp, ks, vs, sm, k_sc, v_sc = args
    T.run_in(
        terms,
        lambda: _core.write_kv(k, v, fk, kp, vp, fp, ks, vs, sm, k_scale=k_sc, v_scale=v_sc),
    )
