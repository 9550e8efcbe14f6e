"""Concurrent callers, CI length (issue 29): scripts/stress_threads.py's run
for a few seconds in this process: 8 threads calling softmax, attention
(every K/V format, paged), cross_entropy and linear_cross_entropy on shared
inputs, every result bit for bit the single-threaded one, no exception, and
resident memory flat after the warm-up (growth below 8 MiB). The long form
(10 minutes) is scripts/stress.sh.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stress_threads.py"


def load_script():
    spec = importlib.util.spec_from_file_location("stress_threads", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eight_threads_bitwise_and_flat_memory():
    r = load_script().run(seconds=4.0, threads=8, warmup_passes=2, rss_limit_mib=8.0)
    assert r["errors"] == 0, r["error_examples"]
    assert r["mismatches"] == 0, r["mismatch_examples"]
    # Every kind of call ran on every thread, past the warm-up.
    assert all(n >= 8 * 2 for n in r["per_call"].values()), r["per_call"]
    assert r["calls_after_warmup"] > 0
    assert r["growth_mib"] < 8.0, r
    assert r["ok"]
