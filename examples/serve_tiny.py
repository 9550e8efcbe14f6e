"""A tiny serving engine on softdot: the program an engine developer reads first.

A decoder-only transformer with seeded random weights (embedding, RMSNorm, RoPE,
grouped-query attention, a gated MLP) serves 8 prompts of different lengths with
continuous batching over a paged K/V cache. Every step packs the rows of all
running sequences into one ragged batch, the way vLLM's scheduler does:

  - prefill chunks of the prompts still being read (at most ``--chunk`` rows),
  - one decode row for every sequence that is generating,

then, per layer, writes the step's new keys and values into their cache slots
(``softdot.write_kv``, vLLM's ``reshape_and_cache``) and attends over the pages
(``softdot.paged_attention`` with ``query_start_loc``: every sequence's rows one
after another, each with its own length). A sequence that finishes frees its
pages and a waiting prompt takes its place.

    python examples/serve_tiny.py                    # float32 cache, greedy
    python examples/serve_tiny.py --cache int8       # int8 pages, quantised on write
    python examples/serve_tiny.py --cache float8_e4m3fn  # fp8 pages, a scale per token
    python examples/serve_tiny.py --cache bfloat16 --temperature 0.8 --seed 3

The next tokens of every step come from one ``softdot.sample`` call (greedy at
temperature 0; else temperature, ``--top-p``, and a seed per row made of the
request's id and position, so a request's tokens do not depend on its batch).

With the float32 cache the greedy tokens are those of the same model run in
plain torch float32 (``--check`` recomputes every prompt with
``torch.nn.functional.scaled_dot_product_attention``; tests/python/
test_example_serve.py asserts it). It prints the tokens and tokens/s.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

import softdot


@dataclass
class Config:
    vocab: int = 256
    dim: int = 128
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 256
    rope_theta: float = 10000.0


def make_weights(cfg: Config, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Seeded random weights, scaled so activations stay of order 1."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

    p: Dict[str, torch.Tensor] = {"embed": torch.randn(cfg.vocab, cfg.dim, generator=g)}
    for i in range(cfg.layers):
        p[f"{i}.wq"] = w(cfg.heads * cfg.head_dim, cfg.dim)
        p[f"{i}.wk"] = w(cfg.kv_heads * cfg.head_dim, cfg.dim)
        p[f"{i}.wv"] = w(cfg.kv_heads * cfg.head_dim, cfg.dim)
        p[f"{i}.wo"] = w(cfg.dim, cfg.heads * cfg.head_dim)
        p[f"{i}.w1"] = w(cfg.hidden, cfg.dim)
        p[f"{i}.w3"] = w(cfg.hidden, cfg.dim)
        p[f"{i}.w2"] = w(cfg.dim, cfg.hidden)
    p["out"] = w(cfg.vocab, cfg.dim)
    return p


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [T, H, E] at positions pos [T] (rotate-half form)."""
    e = x.shape[-1]
    inv = theta ** (-torch.arange(0, e, 2, dtype=torch.float32) / e)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : e // 2], x[..., e // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(
    cfg: Config, p: Dict[str, torch.Tensor], tokens: torch.Tensor, pos: torch.Tensor, attend
):
    """Hidden states of the rows `tokens` [T] at positions `pos` [T];
    attend(layer, q [T, H, E], k, v [T, Hkv, E]) -> [T, H, E]."""
    x = p["embed"][tokens]
    T = tokens.shape[0]
    for i in range(cfg.layers):
        h = rms_norm(x)
        q = (h @ p[f"{i}.wq"].T).view(T, cfg.heads, cfg.head_dim)
        k = (h @ p[f"{i}.wk"].T).view(T, cfg.kv_heads, cfg.head_dim)
        v = (h @ p[f"{i}.wv"].T).view(T, cfg.kv_heads, cfg.head_dim)
        q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        o = attend(i, q.contiguous(), k.contiguous(), v.contiguous())
        x = x + o.reshape(T, -1) @ p[f"{i}.wo"].T
        h = rms_norm(x)
        x = x + (F.silu(h @ p[f"{i}.w1"].T) * (h @ p[f"{i}.w3"].T)) @ p[f"{i}.w2"].T
    return rms_norm(x) @ p["out"].T


# ---- the paged cache and the scheduler ------------------------------------


class PagedCache:
    """Per layer a key and a value cache of `pages` pages of `page_size`
    tokens, [P, page_size, Hkv, E] (vLLM's layout), in float32, bfloat16,
    int8 as (values, scales), or fp8 (float8_e4m3fn) with one scale per token
    and KV head in k_scale / v_scale (SGLang's; write_kv writes them); a free
    list of pages."""

    def __init__(self, cfg: Config, pages: int, page_size: int, dtype: str):
        shape = (pages, page_size, cfg.kv_heads, cfg.head_dim)
        self.page_size = page_size
        self.free = list(range(pages - 1, -1, -1))

        def one():
            if dtype == "int8":
                return (torch.zeros(shape, dtype=torch.int8), torch.zeros(shape[:-1]))
            return torch.zeros(shape, dtype=getattr(torch, dtype))

        self.k = [one() for _ in range(cfg.layers)]
        self.v = [one() for _ in range(cfg.layers)]
        fp8 = dtype.startswith("float8")
        self.k_scale = [torch.zeros(shape[:-1]) if fp8 else None for _ in range(cfg.layers)]
        self.v_scale = [torch.zeros(shape[:-1]) if fp8 else None for _ in range(cfg.layers)]

    def grow(self, pages: List[int], tokens: int) -> None:
        while len(pages) * self.page_size < tokens:
            if not self.free:
                raise RuntimeError("out of cache pages")
            pages.append(self.free.pop())


@dataclass
class Sequence:
    rid: int
    tokens: List[int]  # prompt, then generated
    prompt_len: int
    max_new: int
    cached: int = 0  # tokens whose keys are in the cache
    pages: List[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.max_new


def serve(
    cfg: Config,
    p: Dict[str, torch.Tensor],
    prompts: List[List[int]],
    max_new: int = 16,
    max_running: int = 4,
    chunk: int = 24,
    cache_dtype: str = "float32",
    page_size: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    top_p: float = 1.0,
) -> tuple:
    """Generates max_new tokens for every prompt with continuous batching;
    returns (generated tokens per prompt, steps, seconds)."""
    cache = PagedCache(cfg, pages=128, page_size=page_size, dtype=cache_dtype)
    waiting = [Sequence(i, list(pr), len(pr), max_new) for i, pr in enumerate(prompts)]
    running: List[Sequence] = []
    finished: Dict[int, List[int]] = {}
    steps = 0
    t0 = time.perf_counter()
    while waiting or running:
        while waiting and len(running) < max_running:
            running.append(waiting.pop(0))
        # This step's rows: a prefill chunk, or the one new token.
        rows = [min(chunk, len(s.tokens) - s.cached) for s in running]
        tokens = torch.tensor(
            [t for s, n in zip(running, rows) for t in s.tokens[s.cached : s.cached + n]]
        )
        pos = torch.tensor([s.cached + i for s, n in zip(running, rows) for i in range(n)])
        for s, n in zip(running, rows):
            cache.grow(s.pages, s.cached + n)
        slots = torch.tensor(
            [
                s.pages[j // page_size] * page_size + j % page_size
                for s, n in zip(running, rows)
                for j in range(s.cached, s.cached + n)
            ],
            dtype=torch.int64,
        )
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(rows)]), dtype=torch.int32)
        seq_lens = torch.tensor([s.cached + n for s, n in zip(running, rows)], dtype=torch.int32)
        bps = max(len(s.pages) for s in running)
        table = torch.full((len(running), bps), -1, dtype=torch.int32)
        for b, s in enumerate(running):
            table[b, : len(s.pages)] = torch.tensor(s.pages, dtype=torch.int32)

        def attend(layer, q, k, v, slots=slots, table=table, seq_lens=seq_lens, qsl=qsl):
            # This step's keys and values into their slots, then attention
            # over the pages for every sequence's rows at once (an fp8 cache
            # with its scales: write_kv writes them, attention reads them).
            sc = {}
            if cache.k_scale[layer] is not None:
                sc = dict(k_scale=cache.k_scale[layer], v_scale=cache.v_scale[layer])
            softdot.write_kv(k, v, cache.k[layer], cache.v[layer], slots, **sc)
            return softdot.paged_attention(
                q,
                cache.k[layer],
                cache.v[layer],
                table,
                seq_lens,
                causal=True,
                query_start_loc=qsl,
                **sc,
            )

        logits = forward(cfg, p, tokens, pos, attend)
        steps += 1
        # Each sequence's last row predicts its next token once its prompt
        # is read.
        ends = qsl[1:].long() - 1
        ready = []
        for b, (s, n) in enumerate(zip(running, rows)):
            s.cached += n
            if s.cached < len(s.tokens):
                continue  # still reading its prompt
            ready.append(b)
        if ready:
            # One softdot.sample call for every row that picks a token now
            # (temperature 0: greedy). Each row's seed is a function of its
            # request and position only, so a request's tokens never depend
            # on which other requests share its batch.
            picked = [running[b] for b in ready]
            nxt = softdot.sample(
                logits[ends[ready]],
                temperature=temperature,
                top_p=top_p,
                seed=[(seed << 40) ^ (s.rid << 20) ^ len(s.tokens) for s in picked],
            )
            for s, t in zip(picked, nxt.tolist()):
                s.tokens.append(int(t))
        for s in [s for s in running if s.done]:
            finished[s.rid] = s.tokens[s.prompt_len :]
            cache.free.extend(s.pages)
            running.remove(s)
    seconds = time.perf_counter() - t0
    return [finished[i] for i in range(len(prompts))], steps, seconds


def reference_greedy(cfg: Config, p: Dict[str, torch.Tensor], prompt: List[int], max_new: int):
    """The same model in plain torch float32: every step recomputes the whole
    sequence with causal scaled_dot_product_attention."""
    tokens = list(prompt)
    g = cfg.heads // cfg.kv_heads

    def attend(layer, q, k, v):
        qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))
        kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)[0].transpose(0, 1)

    for _ in range(max_new):
        t = torch.tensor(tokens)
        logits = forward(cfg, p, t, torch.arange(len(tokens)), attend)
        tokens.append(int(torch.argmax(logits[-1])))
    return tokens[len(prompt) :]


def prompts_for(n: int = 8, seed: int = 1, vocab: int = 256) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    lengths = [3, 40, 17, 1, 64, 9, 29, 50][:n]
    return [rng.integers(0, vocab, size=k).tolist() for k in lengths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cache", choices=["float32", "bfloat16", "int8", "float8_e4m3fn"], default="float32"
    )
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--max-running", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=24, help="prefill rows per sequence and step")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (softdot.sample)")
    ap.add_argument("--check", action="store_true", help="compare with plain torch (greedy)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    cfg = Config()
    weights = make_weights(cfg, seed=0)
    prompts = prompts_for()
    out, steps, secs = serve(
        cfg,
        weights,
        prompts,
        max_new=args.max_new,
        max_running=args.max_running,
        chunk=args.chunk,
        cache_dtype=args.cache,
        temperature=args.temperature,
        seed=args.seed,
        top_p=args.top_p,
    )
    total = sum(len(o) for o in out)
    for i, (pr, o) in enumerate(zip(prompts, out)):
        print(f"prompt {i} ({len(pr):2d} tokens) -> {o}")
    print(
        f"{total} tokens in {steps} steps, {secs:.3f} s: {total / secs:.0f} tokens/s "
        f"({args.cache} cache, {softdot.simd_target()})"
    )
    if args.check:
        same = all(
            o == reference_greedy(cfg, weights, pr, args.max_new) for pr, o in zip(prompts, out)
        )
        print("plain torch float32 gives the same tokens" if same else "DIFFERS from plain torch")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
