"""The GIL is released while the C++ core computes: a second Python thread
makes progress during a long softmax, logsumexp, backward, dot, dots and
attention call in the main thread.

How it is observed without timing: the switch interval is raised to 5 s, so
the main thread keeps the GIL between bytecodes. A worker is released just
before the call and counts to N; the main thread reads the counter right
before and right after the call. The worker can only have counted in between
if the call released the GIL (otherwise it would have had to wait 5 s for a
forced switch, after the second read). While the worker has not counted, the
call is repeated, for at most 2 s after the worker was released (well inside
the 5 s switch interval), and the whole observation is retried a few times:
this tolerates a worker that the OS wakes late on a loaded machine (a fast
call can end before it is scheduled) without ever passing a call that holds
the GIL, since such a call could only let the worker count after a 5 s wait.
"""

import sys
import threading
import time

import numpy as np
import pytest
import torch

import softdot

N = 2000
SWITCH_INTERVAL_S = 5.0
FORCED_SWITCH_S = 4.0  # below the switch interval, with margin
REPEAT_WINDOW_S = 2.0


def progress_during(call):
    """(count before, count after) the call, as read by the main thread."""
    counter = [0]
    go = threading.Event()
    done = threading.Event()

    def worker():
        go.wait()
        for _ in range(N):
            counter[0] += 1
        done.set()

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        go.set()
        start = time.monotonic()
        before = counter[0]
        call()
        # Repeat while the worker has not run, staying far below the switch
        # interval: only a released GIL lets it count within this window.
        while counter[0] == before and time.monotonic() - start < REPEAT_WINDOW_S:
            call()
        after = counter[0]
        elapsed = time.monotonic() - start
    finally:
        sys.setswitchinterval(old)
    assert done.wait(30)
    t.join(30)
    if elapsed >= FORCED_SWITCH_S:
        # The interpreter may have forced a switch: this observation proves
        # nothing either way; report no progress so that it is retried.
        return before, before
    return before, after


@pytest.fixture(scope="module")
def big_rows():
    rng = np.random.default_rng(11)
    return rng.standard_normal((2048, 2048))  # 2^22 float64, 32 MiB


def assert_progress(call, attempts=10):
    """Progress in at least one of `attempts` independent calls: a worker
    woken by the OS may miss one call on a loaded machine, but a call that
    holds the GIL never lets it count, however often it is repeated."""
    seen = []
    for _ in range(attempts):
        before, after = progress_during(call)
        assert before == 0
        seen.append(after)
        if after > before:
            return
    raise AssertionError(f"the worker thread made no progress during any call: {seen}")


def test_softmax_releases_gil(big_rows):
    out = np.empty_like(big_rows)

    def call():
        for _ in range(3):
            softdot.softmax(big_rows, out=out)

    assert_progress(call)
    # The result is right (spot check).
    np.testing.assert_array_equal(out[5], softdot.softmax(big_rows[5]))


def test_general_path_and_other_functions_release_gil(big_rows):
    out = np.empty_like(big_rows)
    assert_progress(lambda: softdot.log_softmax(big_rows, axis=0, out=out))
    assert_progress(lambda: softdot.softmax(big_rows, where=big_rows > -2, temperature=0.5))
    assert_progress(lambda: softdot.logsumexp(big_rows, axis=1))
    y = softdot.softmax(big_rows)
    assert_progress(lambda: softdot.softmax_backward(y, big_rows, out=out))
    flat = big_rows.ravel()
    assert_progress(lambda: [softdot.dot(flat, flat, accurate=True) for _ in range(4)])
    assert_progress(lambda: [softdot.dots(big_rows[0], big_rows) for _ in range(4)])


def test_torch_softmax_releases_gil(big_rows):
    t = torch.from_numpy(big_rows)
    assert_progress(lambda: [softdot.softmax(t) for _ in range(3)])


def test_attention_releases_gil():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    k = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
    out = np.empty_like(q)
    assert_progress(lambda: softdot.scaled_dot_product_attention(q, k, k, out=out))
    # The decode form (one query row): long enough with 16384 keys.
    kd = rng.standard_normal((1, 8, 16384, 64)).astype(np.float32)
    assert_progress(
        lambda: [softdot.scaled_dot_product_attention(q[:, :, :1], kd, kd) for _ in range(3)]
    )


def test_a_call_that_holds_the_gil_shows_no_progress():
    """The observation can fail: Python code that never releases the GIL,
    repeated for the whole window, lets the worker count nothing."""

    def hold():
        end = time.monotonic() + 0.005
        while time.monotonic() < end:
            pass

    before, after = progress_during(hold)
    assert (before, after) == (0, 0)
