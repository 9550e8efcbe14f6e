"""Errors in the caller's terms. The core sees every tensor as a 4-d view
[batch, heads, rows, cols] under its own names (q, k_pages, key, ...); the
caller passed arrays of other shapes and axis orders (vLLM's NHD pages
[pages, page_size, H_kv, E], new keys [T, H_kv, E], a query with several
leading axes) under the names of the Python signature. ``Terms`` records,
for each array the core reads, how its view maps back, and ``rewrite``
turns the core's message into the caller's: "k_pages [64, 2, 16, 64]"
becomes "key_cache (64, 16, 2, 64)", "key holds inf at [0, 0, 1, 3]"
becomes "key holds inf at [1, 0, 3]"."""

from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

Index = Tuple[int, ...]


class Terms:
    """The views of one call: core name -> (caller name, caller shape, core
    shape, index map from the core's 4-d index to the caller's)."""

    def __init__(self) -> None:
        self.items: List[
            Tuple[str, str, Tuple[int, ...], Tuple[int, ...], Callable[[Index], Index]]
        ] = []
        self.hints: List[str] = []

    def add(
        self,
        core: str,
        caller: str,
        caller_shape: Sequence[int],
        core_shape: Sequence[int],
        to_caller: Callable[[Index], Index],
    ) -> "Terms":
        self.items.append((core, caller, tuple(caller_shape), tuple(core_shape), to_caller))
        return self

    def hint(self, text: Optional[str]) -> "Terms":
        if text:
            self.hints.append(text)
        return self

    def rewrite(self, message: str) -> str:
        m = message
        for core, caller, cshape, kshape, to_caller in self.items:
            view = f"{core} [{', '.join(str(n) for n in kshape)}]"
            m = m.replace(view, f"{caller} {cshape}")

            def index(match: "re.Match[str]", caller: str = caller, f: Any = to_caller) -> str:
                idx = tuple(int(x) for x in match.group(2).split(", "))
                return f"{caller} holds {match.group(1)} at [{', '.join(map(str, f(idx)))}]"

            m = re.sub(
                rf"(?<![\w.]){re.escape(core)} holds (\S+) at \[(\d+(?:, \d+){{3}})\]", index, m
            )
            if len(core) > 1 and core != caller:
                m = re.sub(rf"(?<![\w.]){re.escape(core)}(?![\w\[])", caller, m)
        return " ".join([m] + self.hints)

    def run(self, call: Callable[[], Any]) -> Any:
        """call(); a ValueError from the core comes out in the caller's terms."""
        try:
            return call()
        except ValueError as e:
            raise ValueError(self.rewrite(str(e))) from None


def run_in(make: Callable[[], Terms], call: Callable[[], Any]) -> Any:
    """call(); a ValueError from the core comes out in the terms make()
    builds. They are built only then: a few microseconds a call, which a
    decode step should not pay when nothing fails."""
    try:
        return call()
    except ValueError as e:
        raise ValueError(make().rewrite(str(e))) from None


def folded(lead: Sequence[int]) -> Callable[[Index], Index]:
    """The core's [b, h, r, c] of an array whose leading axes (lead, 0 or
    more) were folded into b: the caller's index."""
    lead = tuple(lead)

    def f(i: Index) -> Index:
        b, rest = i[0], i[1:]
        out: List[int] = []
        for n in reversed(lead):
            out.append(b % n if n else 0)
            b = b // n if n else 0
        return tuple(reversed(out)) + rest

    return f


def caller_index(shape: Sequence[int]) -> Callable[[Index], Index]:
    """The caller's index into an array of `shape` [..., H, L, E] (or
    [L, E]) that the core reads as [B, H, L, E], B the leading axes folded."""
    if len(shape) == 2:
        return lambda i: (i[2], i[3])
    return folded(tuple(shape)[:-3])


def tokens_heads(i: Index) -> Index:
    """[0, h, t, c] of a [T, H, E] array read as [1, H, T, E]: [t, h, c]."""
    return (i[2], i[1], i[3])


def pages_nhd(i: Index) -> Index:
    """[p, h, r, c] of NHD pages [P, page_size, H, E]: [p, r, h, c]."""
    return (i[0], i[2], i[1], i[3])


def same(i: Index) -> Index:
    return i
