"""scaled_dot_product_attention on torch tensors that require grad: a
torch.autograd.Function whose forward is softdot's attention (saving out and
lse, never the weights) and whose backward is softdot's attention_backward
(C++, by recomputation: memory O(L) beyond the tensors, bitwise the same for
any thread count). Imported by _attention.py on the first such call, so
numpy users never import torch."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from . import _request as R
from ._autograd import first_order
from ._contiguous import Arrays, call

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _4d(t: torch.Tensor) -> torch.Tensor:
    """[..., H, L, E] as [B, H, L, E] (B the product of the leading axes;
    2-d inputs get H = 1)."""
    if t.dim() == 2:
        return t.reshape(1, 1, *t.shape)
    return t.reshape(-1, *t.shape[-3:])


class _Attention(torch.autograd.Function):
    """(q, k, v, bias, sinks) -> (out, lse). spec: the call's fixed
    arguments (name, bool mask, options keywords)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: Optional[torch.Tensor],
        sinks: Optional[torch.Tensor],
        spec: Dict[str, Any],
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        # A 16-bit query's output is computed in float32 and saved as such:
        # the backward's Delta = rowsum(dO * O) then does not carry the
        # 16-bit rounding of O (with values far from 0, that rounding is
        # larger than dP - Delta itself). The caller gets it rounded to the
        # query's dtype.
        wide = q.dtype in (torch.float16, torch.bfloat16)
        out32 = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32) if wide else None
        arrays = Arrays(
            q.detach(),
            k.detach(),
            v.detach(),
            spec["mask"],
            None if bias is None else bias.detach(),
            None if sinks is None else sinks.detach(),
        )
        out, lse = call(spec["fn"], "output", arrays, out32, True, **spec["opts"])
        ctx.save_for_backward(q, k, v, out, lse, bias, sinks)
        ctx.spec = spec
        if wide:
            return out.to(q.dtype), lse
        return out, lse

    @staticmethod
    @first_order("scaled_dot_product_attention")
    def backward(
        ctx: Any, dout: Optional[torch.Tensor], dlse: Optional[torch.Tensor]
    ) -> Tuple[Optional[torch.Tensor], ...]:
        # first_order: softdot's C++ attention_backward has no derivative of
        # its own; differentiating its gradients (create_graph=True, then a
        # loss on them) raises instead of silently dropping the attention's
        # second-order terms (_autograd.py).
        q, k, v, out, lse, bias, sinks = ctx.saved_tensors
        spec = ctx.spec
        fn = spec["fn"]
        need_q, need_k, need_v, need_b, need_s = ctx.needs_input_grad[:5]
        # float64 runs softdot's double backward; float32 and the 16-bit
        # formats (widened exactly) the float32 one, whose gradients are
        # rounded to the inputs' dtype. One request of kind "gradients".
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        fmt = R.KV_F64 if wide == torch.float64 else R.KV_F32
        if dout is None:
            dout = torch.zeros_like(out)

        def work(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(wide).contiguous()

        q4, k4, v4, o4, g4 = (_4d(work(t)) for t in (q, k, v, out, dout))
        dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)
        B, H, L, _ = q4.shape
        S = k4.shape[2]
        full = tuple(q.shape[:-2]) + (L, S)
        bias_d = None if bias is None else bias.detach()
        sinks_d = None if sinks is None else sinks.detach()
        mask4, bias4 = R.masks(fn, spec["mask"], bias_d, "torch", full, "query's batch axes, L, S")
        opts = dict(spec["opts"])
        slopes = opts.pop("alibi_slopes", None)
        if slopes is not None:
            opts["alibi_slopes"] = R.sinks_array(fn, slopes, "torch", "alibi_slopes", "slope")
        o = R.options(fn, mask=mask4, bias=bias4, sinks=R.sinks_array(fn, sinks_d, "torch"), **opts)
        dbias = torch.empty((B, H, L, S), dtype=wide) if need_b else None
        dsinks = torch.empty(H, dtype=wide) if need_s and sinks is not None else None
        io = {
            "out": _np(o4),
            "lse": _np(work(lse)).reshape(-1),
            "dout": _np(g4),
            "dlse": None if dlse is None else _np(work(dlse)).reshape(-1),
            "dq": _np(dq),
            "dk": _np(dk),
            "dv": _np(dv),
            "dbias": None if dbias is None else _np(dbias),
            "dsinks": None if dsinks is None else _np(dsinks),
        }
        kv = {"format": fmt, "k": _np(k4), "v": _np(v4)}
        R.run(fn, _np(q4), kv, "gradients", None, None, o, [], fmt, fmt, backward=io)
        return (
            dq.reshape(q.shape).to(q.dtype) if need_q else None,
            dk.reshape(k.shape).to(k.dtype) if need_k else None,
            dv.reshape(v.shape).to(v.dtype) if need_v else None,
            None if dbias is None or bias is None else dbias.reshape(full).to(bias.dtype),
            None if dsinks is None or sinks is None else dsinks.to(sinks.dtype),
            None,
        )


def wants_grad(*tensors: Any) -> bool:
    """True when grad mode is on and a torch tensor among these requires it."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def attention(fn: str, arrays: Arrays, out: Any, return_lse: bool, opts: Dict[str, Any]) -> Any:
    """scaled_dot_product_attention through _Attention: a float attn_mask
    and the bias become one bias broadcast to [..., Hq, L, S] (their
    gradients reduce through torch's own broadcasting), a bool attn_mask
    stays a mask."""
    query, key, value, attn_mask, bias, sinks = arrays
    if out is not None:
        raise ValueError(
            f"{fn}: out= cannot be used on inputs that require grad "
            f"(autograd needs a result of its own)"
        )
    slopes = opts.get("alibi_slopes")
    if isinstance(slopes, torch.Tensor) and slopes.requires_grad:
        raise NotImplementedError(
            f"{fn}: alibi_slopes requires grad; softdot computes no gradient for the "
            f"ALiBi slopes (pass them detached)"
        )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{fn}: {name} is {type(t).__name__}; with autograd every input must be a "
                f"torch tensor"
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"{fn}: {name} has dtype {t.dtype}; the backward takes float32, float16 or "
                f"bfloat16 (an int8 K/V cache has no gradient: detach the query)"
            )
    mask = None
    total: Optional[torch.Tensor] = None
    if attn_mask is not None:
        if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype == torch.bool:
            mask = attn_mask
        else:
            total = attn_mask
    if bias is not None:
        total = bias if total is None else total + bias
    if total is not None and isinstance(total, torch.Tensor):
        L, S = query.shape[-2], key.shape[-2]
        full = tuple(query.shape[:-2]) + (L, S)
        if total.dtype not in (torch.float32, torch.float64):
            total = total.float()
        try:
            total = total.expand(full)
        except RuntimeError:
            raise ValueError(
                f"{fn}: attn_mask / bias has shape {tuple(total.shape)}, which does not "
                f"broadcast to {full} (query's batch axes, L, S)"
            ) from None
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
    if all(t.dtype == torch.bfloat16 for t in (query, key, value)):
        # The units' P V: the saved output must be that of the float32
        # weights the backward recomputes (Delta = rowsum(dO * O) enters
        # dS = P (dP - Delta), which cancels heavily for values with a mean
        # far from 0): split weights (2^-16 W), never rounded ones (2^-8 W).
        if opts.get("unit_weights") == "rounded":
            raise ValueError(
                f"{fn}: unit_weights='rounded' cannot be used under autograd (the backward "
                f"needs the output of its float32 weights: leave unit_weights unset, or pass "
                f"'split')"
            )
        opts = dict(opts, unit_weights="split")
    spec = {"fn": fn, "mask": mask, "opts": opts}
    out_t, lse = _Attention.apply(query, key, value, total, sinks, spec)
    return (out_t, lse) if return_lse else out_t
