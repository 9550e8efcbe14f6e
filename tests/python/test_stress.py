"""Concurrent callers, CI length (issue 29): scripts/stress_threads.py run
for a few seconds in a fresh interpreter (so that the memory rule sees only
its own allocations, not what earlier tests left in this process's heap),
with OpenMP on two threads underneath: 8 threads calling softmax, attention
(every K/V format, paged), cross_entropy and linear_cross_entropy on shared
inputs, every result bit for bit the single-threaded one, no exception, and
resident memory flat after the warm-up (growth below 8 MiB). The long form
(10 minutes) is scripts/stress.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stress_threads.py"


def test_eight_threads_bitwise_and_flat_memory(tmp_path):
    out = tmp_path / "record.json"
    env = dict(os.environ, OMP_NUM_THREADS="2")
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "4", "--threads", "8", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.exists(), p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["errors"] == 0, r["error_examples"]
    assert r["mismatches"] == 0, r["mismatch_examples"]
    # Every kind of call ran on every thread, past the warm-up.
    assert all(n >= 8 * 2 for n in r["per_call"].values()), r["per_call"]
    assert r["calls_after_warmup"] > 0
    assert r["growth_mib"] < 8.0, r
    assert r["ok"] and p.returncode == 0, p.stdout + p.stderr
