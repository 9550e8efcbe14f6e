"""Fused scaled dot-product attention, its merge and its explicit weights, for
numpy arrays and CPU torch tensors. See docs/python.md. Each function turns
its arguments into one attention request (_request.py)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _request as R
from . import _softdot as _core
from ._contiguous import Arrays, call


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
    unit_weights: Optional[str] = None,
    batch_invariant: bool = False,
    alibi_slopes: Any = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    k_scale: Any = None,
    v_scale: Any = None,
) -> Any:
    """Fused attention: ``out = softmax(mask(bias + cap(scale * Q K^T))) V``,
    never forming the L x S score matrix.

    Parameters
    ----------
    query : array [..., Hq, L, E]; float32, float16 or bfloat16
        torch's layout (B, H, L, E); 2-d and 3-d inputs get leading ones. A
        16-bit query is read as it is (widened exactly inside) and the
        output takes its dtype, as torch's does; lse stays float32. With
        bfloat16 query, key and value the prefill products run on the CPU's
        bfloat16 units (:func:`matrix_unit`: AVX512-BF16's VDPBF16PS).
    key : array [..., Hkv, S, E]; float32, float16 or bfloat16
        (torch.bfloat16, or numpy arrays of ml_dtypes.bfloat16), or an int8
        pair ``(values, scales)``: int8 [..., Hkv, S, E] and float32
        [..., Hkv, S, 1], as :func:`quantize_kv` returns it, standing for
        ``scales * values`` rounded to float32 (the result equals the float32
        call on those values bit for bit). Hq must be a multiple of Hkv
        (grouped-query attention; Hkv = 1 is multi-query).
        key may also be fp8 (torch.float8_e4m3fn / float8_e5m2, or numpy
        arrays of ml_dtypes' float8 types) with ``k_scale``.
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
    out : array [..., Hq, L, Ev], optional
        The query's dtype, or float32 (the result rounded once to float32).
    precise : bool, default False
        Scores in double, carried as two floats into exp (C++
        ``AttentionOptions::precise``): a few u W of error even for scores
        near +-100, at about twice the score cost; always the prefill form.
    unit_weights : "rounded" or "split", optional
        On the bfloat16 units, the weights P enter the P V product rounded
        once to bfloat16 ("rounded", as other libraries do: adds at most
        2^-9 W to the error bound) or as a bfloat16 high part plus the
        bfloat16 nearest to the rest ("split", two products: 2^-18 W, about
        1.3x the time). Without units P stays float32 either way. Default:
        "rounded", except under autograd with bfloat16 query, key and value,
        where it is "split" and "rounded" is refused: the backward's
        Delta = rowsum(dO * O) must come from the weights it recomputes
        (float32), and dP - Delta cancels heavily when the values' mean is
        far from 0, so an output of rounded weights made dQ up to 12x less
        accurate (docs/python.md, "Training").
    batch_invariant : bool, default False
        Every row in the decode form's arithmetic, its keys in chunks of
        512 at fixed key indices merged in order (C++
        ``AttentionOptions::batch_invariant``): a row's bits depend only on
        its own query, keys, values and options, not on how many rows the
        call has, at the decode form's speed for decode shapes (prefill
        shapes cost more: docs/performance.md). Not with ``precise``.
    alibi_slopes : array [Hq], optional
        ALiBi, one slope per query head, computed in the kernel: the score
        of query i and key j gains ``slope * (pos_j - pos_i)`` (positions
        as ``causal`` places them), rounded once to float32 and added as a
        bias is (bit for bit that bias). Not with ``bias``.

    k_scale, v_scale : float or float32 array, optional (fp8 key and value only)
        A per-tensor scale (vLLM's, default 1.0) or one per token and head
        ([..., Hkv, S] or [..., Hkv, S, 1]): each element stands for
        ``scale * value`` rounded once to float32, and the result equals the
        float32 call on those values bit for bit.

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
    Autograd: on torch tensors that require grad (query, key, value, a
    float ``attn_mask``, ``bias``, ``sinks``) the call is a
    ``torch.autograd.Function``: the forward saves out and lse (never the
    weights), the backward is softdot's ``attention_backward`` (C++,
    FlashAttention-2's recomputation with the forward's scores and exp;
    sums in double, each gradient rounded once; bitwise the same for any
    thread count; docs/python.md, "Training"). The lse returned with
    ``return_lse`` is differentiable too. 16-bit inputs are widened to
    float32 for the backward and their gradients rounded to their dtype;
    their forward keeps its float32 output for the backward and returns it
    rounded to the query's dtype (twice rounded: at a 16-bit tie, about one
    element in 2^16, the last bit can differ from the call without autograd).
    ``out=`` is refused there, and ALiBi slopes get no gradient
    (NotImplementedError when they require it).
    """
    fn = "scaled_dot_product_attention"
    causal, top_left = R.torch_aliases(fn, causal, is_causal, enable_gqa, dropout_p)
    opts: Dict[str, Any] = dict(scale=scale, causal=causal, window=window, softcap=softcap)
    opts.update(kv_range=kv_range, precise=precise, top_left=top_left, unit_weights=unit_weights)
    opts.update(batch_invariant=batch_invariant, alibi_slopes=alibi_slopes)
    arrays = Arrays(query, key, value, attn_mask, bias, sinks)
    if A.kind_of(query) == "torch":
        from . import _attention_grad as G

        if G.wants_grad(query, key, value, attn_mask, bias, sinks, alibi_slopes):
            if k_scale is not None or v_scale is not None:
                raise NotImplementedError(
                    f"{fn}: an fp8 K/V cache has no gradient: detach the query"
                )
            return G.attention(fn, arrays, out, return_lse, opts)
    return call(fn, "output", arrays, out, return_lse, k_scale=k_scale, v_scale=v_scale, **opts)


scaled_dot_product_attention.__doc__ = (scaled_dot_product_attention.__doc__ or "") + R.CAUSAL_DOC


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
    k_scale: Any = None,
) -> Any:
    """The explicit weights [..., Hq, L, S] that :func:`scaled_dot_product_attention`
    applies to V, with the same options (for small inputs: inspection, teaching).

    key may be an int8 ``(values, scales)`` pair, or fp8 with ``k_scale``, as for
    :func:`scaled_dot_product_attention`.
    Scores are computed as the fused prefill form computes them (the same
    bits); the weights are rounded once from double arithmetic, so
    ``weights @ V`` equals the fused output within its bound. Keys outside
    ``kv_range`` and masked keys get weight +0.
    """
    fn = "attention_weights"
    return call(
        fn,
        "weights",
        Arrays(query, key, None, attn_mask, bias, sinks),
        out,
        False,
        scale=scale,
        causal=causal,
        window=window,
        softcap=softcap,
        kv_range=kv_range,
        k_scale=k_scale,
    )


attention_weights.__doc__ = (attention_weights.__doc__ or "") + R.CAUSAL_DOC


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
        a = R.array(fn, name, a, kind)
        if A.dtype_str(a) != "float32":
            raise A.accepted(fn, name, a, "float32")
        arrs.append(R.as_numpy(fn, name, a, kind))
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
    target, direct = R.target(o)
    _core.attention_merge(
        R.ready(R.to4(oa)),
        np.ascontiguousarray(la),
        R.ready(R.to4(ob)),
        np.ascontiguousarray(lb),
        target,
        lse,
    )
    if not direct:
        np.copyto(o, target.reshape(oa.shape))
    return user, lse_user
