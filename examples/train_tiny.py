"""Training a tiny causal language model with softdot's attention in torch.

A decoder-only transformer (2 layers, d_model 64, 4 query heads over 2 K/V
heads, RMSNorm, RoPE, a gated MLP, tied embeddings) learns seeded synthetic
sequences with AdamW. Only the attention call changes between the backends:

  softdot: softdot.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
  torch:   torch.nn.functional.scaled_dot_product_attention(<the same arguments>)

On tensors that require grad softdot's call is a torch.autograd.Function whose
backward is softdot's C++ attention_backward; everything else (embedding,
matmuls, norms, the loss, AdamW) is torch's in both runs, from the same initial
weights and the same batches.

The data: a random Markov chain over 32 tokens (each token has 3 possible
successors) generates a segment of 16 tokens, and a sequence is that segment
repeated 4 times (64 tokens). A model can predict the first segment only as
well as the chain allows, and the three copies exactly by attending 16
positions back, so the best possible loss is known (printed as "floor"):
the chain's conditional entropy over the first segment, 0 for the copies.
Uniform guessing costs ln 32 = 3.47 nats.

    python examples/train_tiny.py                       # softdot, 300 steps
    python examples/train_tiny.py --attention torch     # torch's SDPA
    python examples/train_tiny.py --compare             # both, side by side
    python examples/train_tiny.py --check-reproducible  # softdot, 1 vs 2 threads

--compare prints both loss curves (the training loss every --log-every steps,
and a held-out loss on 64 fixed sequences), their largest difference, the
same difference between torch's run and torch's run from weights moved one
ulp up (the noise: how far training carries a rounding-sized difference),
and whether the curves agree. The two runs differ only by rounding in the
attention (about 1e-7 relative), and training amplifies such differences
(AdamW divides by the root of the squared gradients, so tiny gradient
components get full-size updates): the curves wander apart by a few 1e-3
nats over 300 steps, as the noise reference does. The criterion:
  - the losses at step 0 (the same weights and batch; only the attention's
    rounding apart) agree to 1e-5 relative;
  - the final held-out losses (64 sequences: less noisy than one batch)
    agree within 3% + 0.01 nats, over ten times the differences seen here, so
    that another seed or CPU does not fail it, while a wrong gradient
    does (with dK dropped, or dQ or dV of the wrong sign, the run ends
    0.13 to 0.79 nats above torch's);
  - both end below half of ln 32 (they learnt the pattern, not merely
    drifted together).

--check-reproducible trains with softdot twice, in two processes, with 1 and
then 2 OpenMP threads for softdot's attention (forward and backward), and
asserts that every loss and every final weight is bitwise the same. softdot
and torch share one OpenMP runtime, and torch's own CPU ops (MKL's GEMM,
reductions) are not guaranteed to give the same bits across thread counts
(--check-torch-threads tests that), so both processes run torch's ops with
one thread and switch softdot's calls alone to their thread count (around
the forward call, and with hooks on the backward's node): the check is about
softdot's bits, not torch's. --threads N sets torch's intra-op threads (and
softdot's, unless --softdot-threads says otherwise); the default is 1: the
model is so small that a second thread costs more than it gains (on a busy
2-core machine a step took 9 times as long with 2).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import softdot

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Config:
    vocab: int = 32
    dim: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 128
    rope_theta: float = 10000.0


@dataclass
class Run:
    steps: int = 300
    batch: int = 16
    seq_len: int = 64
    period: int = 16  # the repeated segment's length
    successors: int = 3  # the Markov chain's out-degree
    lr: float = 6e-3
    warmup: int = 20
    weight_decay: float = 0.1
    seed: int = 0
    log_every: int = 25


# ---- data ------------------------------------------------------------------


class MarkovData:
    """A seeded random Markov chain over cfg.vocab tokens; batches of its
    segments of `period` tokens, each repeated up to `seq_len`."""

    def __init__(self, vocab: int, run: Run):
        g = torch.Generator().manual_seed(1000 + run.seed)
        self.run = run
        self.vocab = vocab
        trans = torch.zeros(vocab, vocab, dtype=torch.float64)
        for a in range(vocab):
            succ = torch.randperm(vocab, generator=g)[: run.successors]
            w = torch.rand(run.successors, generator=g, dtype=torch.float64) + 0.5
            trans[a, succ] = w / w.sum()
        self.trans = trans
        self.g = g

    def batch(self, n: int) -> torch.Tensor:
        """[n, seq_len] int64 tokens, the next ones from the generator."""
        r = self.run
        seg = torch.empty(n, r.period, dtype=torch.int64)
        seg[:, 0] = torch.randint(self.vocab, (n,), generator=self.g)
        for t in range(1, r.period):
            seg[:, t] = torch.multinomial(self.trans[seg[:, t - 1]], 1, generator=self.g)[:, 0]
        reps = (r.seq_len + r.period - 1) // r.period
        return seg.repeat(1, reps)[:, : r.seq_len].contiguous()

    def floor(self) -> float:
        """The lowest expected loss per predicted token (nats): the chain's
        conditional entropy H(x_t | x_{t-1}) summed over the first segment
        (the first token uniform), 0 for the copies, over seq_len - 1."""
        p = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        logs = torch.where(self.trans > 0, self.trans.log(), torch.zeros_like(self.trans))
        h_row = -(self.trans * logs).sum(1)  # entropy of each row
        total = 0.0
        for _ in range(1, self.run.period):
            total += float(p @ h_row)
            p = p @ self.trans
        return total / (self.run.seq_len - 1)


# ---- the model -------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rope_tables(cfg: Config, seq_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    e = cfg.head_dim
    inv = cfg.rope_theta ** (-torch.arange(0, e, 2, dtype=torch.float32) / e)
    ang = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()  # [L, E/2]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, H, L, E] (rotate-half form)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.norm1 = RMSNorm(cfg.dim)
        self.wq = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)
        self.norm2 = RMSNorm(cfg.dim)
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        c = self.cfg
        B, L, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(B, L, c.heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, L, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, L, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rope(q, cos[:L], sin[:L]), rope(k, cos[:L], sin[:L])
        o = attend(q.contiguous(), k.contiguous(), v.contiguous())  # [B, H, L, E]
        x = x + self.wo(o.transpose(1, 2).reshape(B, L, -1))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLM(nn.Module):
    def __init__(self, cfg: Config, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        nn.init.normal_(self.embed.weight, std=0.1)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        cos, sin = rope_tables(cfg, seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, attend)
        return self.norm(x) @ self.embed.weight.T  # tied output embedding


# ---- the two attention calls and the threads ------------------------------


@contextlib.contextmanager
def omp_threads(n: Optional[int]) -> Iterator[None]:
    """torch.set_num_threads(n) inside, the count before restored after.
    softdot and torch share one OpenMP runtime, so this sets softdot's
    thread count too."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def softdot_attention(threads: Optional[int] = None) -> Attend:
    """softdot's causal GQA attention; with `threads`, its forward and its
    backward (hooks on the autograd node) run with that many OpenMP threads
    while torch's ops keep theirs."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with omp_threads(threads):
            o = softdot.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        node = o.grad_fn
        if threads is not None and node is not None:
            inner, outer = threads, torch.get_num_threads()
            node.register_prehook(lambda grads: torch.set_num_threads(inner))
            node.register_hook(lambda grads_in, grads_out: torch.set_num_threads(outer))
        return o

    return attend


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def attention_for(name: str, softdot_threads: Optional[int] = None) -> Attend:
    if name == "softdot":
        return softdot_attention(softdot_threads)
    if name == "torch":
        return torch_attention
    raise ValueError(f"unknown attention {name!r}")


# ---- training --------------------------------------------------------------


@dataclass
class Result:
    losses: List[float]  # training loss at every step
    evals: Dict[int, float]  # held-out loss at the logged steps
    step_time: float  # seconds per step, steps after the first 5
    digest: str  # sha256 of the final weights' bytes
    floor: float


def lr_at(run: Run, step: int) -> float:
    """Linear warmup, then cosine decay to 10%."""
    if step < run.warmup:
        return run.lr * (step + 1) / run.warmup
    t = (step - run.warmup) / max(1, run.steps - run.warmup)
    return run.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(
    cfg: Config,
    run: Run,
    attention: str,
    softdot_threads: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
    nudge: bool = False,
) -> Result:
    """Train from the seeded weights on the seeded batches; the same for
    either attention. nudge: every initial weight one ulp up (towards +inf),
    a perturbation of the size of rounding, to measure how far training
    carries such a difference."""
    attend = attention_for(attention, softdot_threads)
    torch.manual_seed(run.seed)
    model = TinyLM(cfg, run.seq_len)
    if nudge:
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(torch.nextafter(prm, torch.tensor(math.inf)))
    data = MarkovData(cfg.vocab, run)
    held_out = data.batch(64)  # drawn first: the same for any --steps
    batches = [data.batch(run.batch) for _ in range(run.steps)]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": run.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=run.lr,
        betas=(0.9, 0.95),
        foreach=False,
    )

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1], attend)
        return F.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))

    losses: List[float] = []
    evals: Dict[int, float] = {}
    timed = 0.0  # the training steps' time, without the held-out evaluations
    for step in range(run.steps):
        if step % run.log_every == 0 or step == run.steps - 1:
            with torch.no_grad():
                evals[step] = float(loss_of(held_out))
        for group in opt.param_groups:
            group["lr"] = lr_at(run, step)
        t0 = time.perf_counter()
        loss = loss_of(batches[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        losses.append(loss.item())
        if step >= 5 or run.steps <= 5:  # the first steps warm caches up
            timed += time.perf_counter() - t0
        if log is not None and step in evals:
            log(f"  step {step:4d}  loss {losses[-1]:.4f}  held-out {evals[step]:.4f}")
    step_time = timed / max(1, run.steps - 5 if run.steps > 5 else run.steps)
    return Result(losses, evals, step_time, weights_digest(model), data.floor())


# ---- comparing the curves ---------------------------------------------------


def curves_agree(a: Result, b: Result, vocab: int) -> Tuple[bool, List[str]]:
    """The criterion of the docstring; (verdict, one line per condition)."""
    ok = True
    lines = []
    d0 = abs(a.losses[0] - b.losses[0])
    c0 = d0 <= 1e-5 * abs(a.losses[0])
    lines.append(f"step 0: |difference| {d0:.2e} <= 1e-5 x {a.losses[0]:.4f}: {c0}")
    last = max(a.evals)
    ea, eb = a.evals[last], b.evals[last]
    tol = 0.03 * max(ea, eb) + 0.01
    c1 = abs(ea - eb) <= tol
    lines.append(
        f"final held-out {ea:.4f} vs {eb:.4f}: |difference| {abs(ea - eb):.4f} <= {tol:.4f}: {c1}"
    )
    half = 0.5 * math.log(vocab)
    c2 = ea < half and eb < half
    lines.append(f"both below half of ln {vocab} ({half:.3f}): {c2}")
    ok = c0 and c1 and c2
    return ok, lines


def max_difference(a: Result, b: Result) -> Tuple[float, float]:
    """Largest |difference| of the training losses and of the held-out ones."""
    dt = max(abs(x - y) for x, y in zip(a.losses, b.losses))
    de = max(abs(a.evals[s] - b.evals[s]) for s in a.evals)
    return dt, de


def tokens_per_second(run: Run, r: Result) -> float:
    return run.batch * (run.seq_len - 1) / r.step_time


def print_curves(run: Run, names: List[str], results: List[Result]) -> None:
    head = "  step" + "".join(f"  {n + ' loss':>14}  {'held-out':>9}" for n in names)
    print(head)
    for step in sorted(results[0].evals):
        row = f"  {step:4d}"
        for r in results:
            row += f"  {r.losses[step]:14.4f}  {r.evals[step]:9.4f}"
        print(row)


# ---- reproducibility across thread counts ----------------------------------


def child_run(run: Run, attention: str, threads: int, softdot_threads: Optional[int]) -> Dict:
    """Train in a subprocess (this file with --child, OMP_NUM_THREADS and
    torch's threads set to `threads` from the start); its losses (as hex)
    and its weights' sha256."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--attention", attention]
    cmd += ["--threads", str(threads), "--steps", str(run.steps), "--seed", str(run.seed)]
    cmd += ["--batch", str(run.batch), "--seq-len", str(run.seq_len), "--lr", repr(run.lr)]
    if softdot_threads is not None:
        cmd += ["--softdot-threads", str(softdot_threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_reproducible(run: Run, threads: Tuple[int, int] = (1, 2)) -> bool:
    """softdot's run with softdot's calls on threads[0] and then threads[1]
    OpenMP threads, torch's ops on 1 in both: every loss and weight bitwise
    the same?"""
    a = child_run(run, "softdot", 1, threads[0])
    b = child_run(run, "softdot", 1, threads[1])
    same = a == b
    print(
        f"softdot's attention on {threads[0]} vs {threads[1]} threads (torch's ops on 1), "
        f"{run.steps} steps: {'bitwise the same' if same else 'DIFFERENT'}; final loss "
        f"{float.fromhex(a['losses'][-1]):.6f} / {float.fromhex(b['losses'][-1]):.6f}, "
        f"weights sha256 {a['digest'][:16]} / {b['digest'][:16]}"
    )
    return same


def check_torch_threads(run: Run, attention: str) -> bool:
    """The whole run (torch's ops and softdot's) on 1 and then 2 threads:
    the same bits? Depends on torch's CPU kernels (MKL, reductions), which
    promise no such thing; reported, not required."""
    a = child_run(run, attention, 1, None)
    b = child_run(run, attention, 2, None)
    same = a == b
    print(
        f"{attention}'s run with every op on 1 vs 2 threads, {run.steps} steps: "
        f"{'bitwise the same' if same else 'different bits'}; final loss "
        f"{float.fromhex(a['losses'][-1]):.6f} / {float.fromhex(b['losses'][-1]):.6f}"
    )
    return same


# ---- the command line -------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--attention", choices=["softdot", "torch"], default="softdot")
    ap.add_argument("--compare", action="store_true", help="train with both and compare the curves")
    ap.add_argument(
        "--check-reproducible",
        action="store_true",
        help="softdot's run with 1 and 2 threads: the same bits?",
    )
    ap.add_argument(
        "--check-torch-threads",
        action="store_true",
        help="torch's run, all ops with 1 and 2 threads: the same bits?",
    )
    ap.add_argument("--steps", type=int, default=Run.steps)
    ap.add_argument("--batch", type=int, default=Run.batch)
    ap.add_argument("--seq-len", type=int, default=Run.seq_len)
    ap.add_argument("--lr", type=float, default=Run.lr)
    ap.add_argument("--seed", type=int, default=Run.seed)
    ap.add_argument("--log-every", type=int, default=Run.log_every)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch's intra-op (and OpenMP) threads (1)"
    )
    ap.add_argument(
        "--softdot-threads", type=int, default=None, help="OpenMP threads for softdot's calls alone"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)  # one OpenMP runtime: softdot's too
    cfg = Config()
    run = Run(
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq_len,
        lr=args.lr,
        seed=args.seed,
        log_every=args.log_every,
    )

    if args.child:
        r = train(cfg, run, args.attention, args.softdot_threads)
        print(json.dumps({"losses": [x.hex() for x in r.losses], "digest": r.digest}))
        return 0

    if args.check_reproducible or args.check_torch_threads:
        ok = True
        if args.check_reproducible:
            ok = check_reproducible(run)
        if args.check_torch_threads:
            check_torch_threads(run, "torch")
            check_torch_threads(run, "softdot")
        return 0 if ok else 1

    threads = torch.get_num_threads()
    floor = MarkovData(cfg.vocab, run).floor()
    print(
        f"tiny LM: {cfg.layers} layers, d_model {cfg.dim}, {cfg.heads} heads over "
        f"{cfg.kv_heads} K/V heads; {run.steps} steps of {run.batch} x {run.seq_len} tokens; "
        f"torch threads {threads}"
    )
    print(
        f"loss of a uniform guess ln {cfg.vocab} = {math.log(cfg.vocab):.4f}; "
        f"best possible (floor) {floor:.4f}"
    )
    if not args.compare:
        r = train(cfg, run, args.attention, args.softdot_threads, log=print)
        print(
            f"{args.attention}: {r.step_time * 1e3:.1f} ms/step, "
            f"{tokens_per_second(run, r):.0f} tokens/s"
        )
        return 0

    names = ["softdot", "torch"]
    results = [train(cfg, run, n, args.softdot_threads) for n in names]
    noise = train(cfg, run, "torch", nudge=True)
    print_curves(run, names, results)
    dt, de = max_difference(results[0], results[1])
    nt, ne = max_difference(results[1], noise)
    print(f"max |softdot - torch|: training loss {dt:.4f}, held-out {de:.4f}")
    print(
        f"noise for reference, max |torch - torch with weights one ulp up|: "
        f"training loss {nt:.4f}, held-out {ne:.4f}"
    )
    ok, lines = curves_agree(results[0], results[1], cfg.vocab)
    for line in lines:
        print("  " + line)
    print(f"the curves agree within noise: {ok}")
    for n, r in zip(names, results):
        print(f"{n:>8}: {r.step_time * 1e3:.1f} ms/step, {tokens_per_second(run, r):.0f} tokens/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
