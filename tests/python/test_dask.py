"""softdot.dask on a dask.distributed LocalCluster of two worker processes (one
thread each, one cluster for the module): softmax, log_softmax and logsumexp
of arrays chunked along the axis against the in-memory functions (bitwise
with one chunk along the axis, within 1 ulp otherwise) and against the exact
(long double) references, the special values across chunks, determinism for a
given chunking, argument errors, and `import softdot` without dask."""

import os
import subprocess
import sys

# dask[array] and distributed are test dependencies (pyproject.toml): imported
# directly, so a missing one is a collection error, never a silent skip.
import dask
import dask.array as da
import distributed
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import softdot
import softdot.dask as sd

from conftest import (
    assert_ulp,
    from_wide,
    log_softmax_allowance,
    log_softmax_ref,
    logsumexp_mp,
    logsumexp_ref,
    softmax_ref,
    softmax_ref_wide,
    to_wide,
    ulp,
)

INF, NAN = np.inf, np.nan


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    )
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def run(client, *arrays):
    """Computes the arrays on the cluster's worker processes."""
    out = dask.compute(*arrays, scheduler=client.get)
    return out if len(arrays) > 1 else out[0]


def data(rng, shape, dtype, scale=6.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(dtype)


# Chunkings of a [5, 4, 37] array: along the last axis one chunk (bitwise
# path), two, uneven with chunks of 1, a zero-length chunk, one per entry.
CHUNKINGS = {
    "one": ((2, 3), (4,), (37,)),
    "two": ((5,), (1, 3), (18, 19)),
    "uneven": ((1, 4), (2, 2), (1, 7, 1, 16, 12)),
    "empty-chunk": ((3, 2), (4,), (10, 0, 27)),
    "each": ((5,), (4,), (1,) * 37),
}


def test_runs_on_worker_processes(client):
    pids = client.run(os.getpid)
    assert len(pids) == 2 and os.getpid() not in pids.values()
    info = client.scheduler_info()["workers"]
    assert all(w["nthreads"] == 1 for w in info.values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_last_axis_against_memory_and_reference(client, rng, dtype, chunking, temperature):
    x = data(rng, (5, 4, 37), dtype, offset=300.0 if dtype == np.float64 else 0.0)
    X = da.from_array(x, chunks=CHUNKINGS[chunking])
    kw = dict(temperature=temperature)
    y, ly, lse = run(client, sd.softmax(X, **kw), sd.log_softmax(X, **kw), sd.logsumexp(X, **kw))
    assert y.dtype == ly.dtype == lse.dtype == dtype
    assert y.shape == ly.shape == x.shape and lse.shape == x.shape[:-1]
    mem_y = softdot.softmax(x, **kw)
    mem_ly = softdot.log_softmax(x, **kw)
    mem_lse = softdot.logsumexp(x, axis=-1, **kw)
    if chunking == "one":  # each block is the in-memory call: the same bits
        assert np.array_equal(y, mem_y)
        assert np.array_equal(ly, mem_ly)
        assert np.array_equal(lse, mem_lse)
        return
    # softmax: faithful, so within 1 ulp of the exact weight and of memory.
    assert_ulp(y, softmax_ref(x, **kw), 1)
    assert_ulp(y, mem_y, 1)
    # logsumexp of the merged state: 1 ulp.
    assert_ulp(lse, logsumexp_ref(x, axis=-1, **kw), 1)
    assert_ulp(lse, mem_lse, 1)
    # log_softmax rounded once from a wide value: 1 ulp of the exact value;
    # from memory within memory's allowance + 1 ulp.
    assert_ulp(ly, log_softmax_ref(x, **kw), 1)
    ref = softmax_ref_wide(x, temperature=temperature, log=True)
    lim = log_softmax_allowance(ref, dtype) + to_wide(ulp(from_wide(ref, dtype)))
    assert np.all(np.abs(to_wide(ly) - to_wide(mem_ly)) <= lim)
    assert np.all(ly <= 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -3])
def test_other_axes(client, rng, dtype, axis):
    x = data(rng, (11, 6, 5), dtype)
    X = da.from_array(x, chunks=(3, 4, 2))
    y, ly, lse, lsek = run(
        client,
        sd.softmax(X, axis=axis),
        sd.log_softmax(X, axis=axis),
        sd.logsumexp(X, axis=axis),
        sd.logsumexp(X, axis=axis, keepdims=True),
    )
    assert sd.softmax(X, axis=axis).chunks == X.chunks
    assert_ulp(y, softmax_ref(x, axis=axis), 1)
    assert_ulp(y, softdot.softmax(x, axis=axis), 1)
    assert_ulp(ly, log_softmax_ref(x, axis=axis), 1)
    ref_lse = logsumexp_ref(x, axis=axis)
    assert_ulp(lse, ref_lse, 1)
    assert lsek.shape == np.expand_dims(ref_lse, axis).shape
    assert np.array_equal(lsek, np.expand_dims(lse, axis))


def test_one_dimensional_and_integers(client, rng):
    x = rng.integers(-50, 50, size=101)
    X = da.from_array(x, chunks=17)
    y, lse = run(client, sd.softmax(X), sd.logsumexp(X))
    assert y.dtype == np.float64 and lse.shape == ()
    assert_ulp(y, softmax_ref(x.astype(np.float64)), 1)
    assert_ulp(lse, logsumexp_ref(x.astype(np.float64)), 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_across_chunks(client, rng, dtype):
    x = data(rng, (6, 40), dtype)
    keep = rng.random((6, 40)) < 0.6
    keep[1] = False  # a row excluded in every chunk
    keep[2, :20] = False  # the first two chunks excluded: the merge's identity
    x[3, 5] = NAN  # an excluded NaN is ignored
    keep[3, 5] = False
    X = da.from_array(x, chunks=(4, 10))
    W = da.from_array(keep, chunks=(3, 7))  # another chunking: rechunked to x's
    y, ly, lse = run(
        client, sd.softmax(X, where=W), sd.log_softmax(X, where=W), sd.logsumexp(X, where=keep)
    )
    assert np.all(y[1] == 0) and np.all(ly[1] == -INF) and lse[1] == -INF
    assert np.all(y[~keep] == 0) and np.all(ly[~keep] == -INF)
    live = [0, 2, 3, 4, 5]
    assert_ulp(y[live], softmax_ref(x[live], where=keep[live]), 1)
    assert_ulp(y, softdot.softmax(x, where=keep), 1)
    ref = log_softmax_ref(x[live], where=keep[live])
    assert_ulp(np.where(keep[live], ly[live], 0), np.where(keep[live], ref, 0), 1)
    assert_ulp(lse[live], logsumexp_ref(x[live], axis=-1, where=keep[live]), 1)
    # A where that broadcasts: one mask row for every row.
    row = keep[0]
    y2 = run(client, sd.softmax(X, where=row[None, :]))
    assert_ulp(y2, softmax_ref(x, where=np.broadcast_to(row, x.shape)), 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values_across_chunks(client, dtype):
    n = 12
    x = np.tile(np.linspace(-3, 3, n), (6, 1)).astype(dtype)
    x[0, :] = -INF  # every entry -inf in every chunk
    x[1, 9] = NAN  # a NaN in the last chunk only
    x[2, 1] = x[2, 10] = INF  # +inf in two chunks: 1/2 each
    x[3, 4:8] = -INF  # a chunk of -inf: the identity
    x[4, 0] = INF  # one +inf in the first chunk
    x[5, 2] = NAN  # NaN in the first chunk, +inf in another
    x[5, 11] = INF
    X = da.from_array(x, chunks=(2, 4))
    y, ly, lse = run(client, sd.softmax(X), sd.log_softmax(X), sd.logsumexp(X))
    mem = softdot.softmax(x), softdot.log_softmax(x), softdot.logsumexp(x, axis=-1)
    for got, want in zip((y, ly, lse), mem):
        assert np.array_equal(got[[0, 1, 2, 4, 5]], want[[0, 1, 2, 4, 5]], equal_nan=True)
    assert np.all(y[0] == 0) and np.all(np.signbit(y[0]) == 0)
    assert np.all(ly[0] == -INF) and lse[0] == -INF
    assert np.all(np.isnan(y[1])) and np.all(np.isnan(ly[1])) and np.isnan(lse[1])
    assert np.all(np.isnan(y[5])) and np.isnan(lse[5])
    half = np.zeros(n, dtype)
    half[[1, 10]] = 0.5
    assert np.array_equal(y[2], half) and lse[2] == INF
    assert np.array_equal(ly[2], np.where(half > 0, -dtype(np.log(2)), -INF).astype(dtype))
    one = np.zeros(n, dtype)
    one[0] = 1
    with np.errstate(divide="ignore"):
        assert np.array_equal(y[4], one) and np.array_equal(ly[4], np.log(one))
    assert not np.signbit(ly[4, 0])
    keep = np.isfinite(x[3])
    assert_ulp(y[3], softmax_ref(x[3], where=keep), 1)
    assert_ulp(lse[3], logsumexp_ref(x[3], where=keep), 1)


def test_nan_with_where_marks_excluded_entries_too(client):
    x = np.array([[1.0, NAN, 2.0, 3.0, 4.0, 5.0]], np.float32)
    keep = np.array([[True, True, True, False, True, True]])
    X = da.from_array(x, chunks=(1, 2))
    ly = run(client, sd.log_softmax(X, where=keep))
    assert np.array_equal(ly, softdot.log_softmax(x, where=keep), equal_nan=True)
    assert np.all(np.isnan(ly))


def test_overflowing_scaled_scores(client):
    # 3e38 / 0.5 overflows float32: it counts as +inf, as in memory.
    x = np.array([[3e38, 1.0, 2.0, -3e38, 1.0, 1.0], [1e3, 1.0, 2.0, -3e38, 1.0, 1.0]], np.float32)
    X = da.from_array(x, chunks=(1, 3))
    for t in (1.0, 0.5):
        y, ly, lse = run(
            client,
            sd.softmax(X, temperature=t),
            sd.log_softmax(X, temperature=t),
            sd.logsumexp(X, temperature=t),
        )
        assert np.array_equal(y, softdot.softmax(x, temperature=t))
        assert np.array_equal(ly, softdot.log_softmax(x, temperature=t))
        assert np.array_equal(lse, softdot.logsumexp(x, axis=-1, temperature=t))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_for_the_same_chunking(client, rng, dtype):
    x = data(rng, (7, 300), dtype)
    X = da.from_array(x, chunks=(3, 23))
    a = run(client, sd.softmax(X), sd.log_softmax(X), sd.logsumexp(X))
    b = run(client, sd.softmax(X), sd.log_softmax(X), sd.logsumexp(X))
    c = dask.compute(sd.softmax(X), sd.log_softmax(X), sd.logsumexp(X), scheduler="sync")
    for u, v, w in zip(a, b, c):
        assert np.array_equal(u, v) and np.array_equal(u, w)
    # Another chunking of the same row: still within the bound.
    y = run(client, sd.softmax(da.from_array(x, chunks=(7, 61))))
    assert_ulp(y, softmax_ref(x), 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_of_log_probabilities_cancels(client, rng, dtype):
    """logsumexp of log-probabilities is about 0: m + log(sum) cancels, and as
    in memory the rows are recomputed in the next wider type (a second pass
    over the chunks). The in-memory bound: 2 ulp plus about u_W |m| (the
    final m + log1p in the wider type: 2^-53 |m| for float32, 2^-64 |m| for
    float64 on x86), with a factor 4 of slack on that term."""
    z = rng.standard_normal((12, 3000)) * 3
    lp = (z - scipy.special.logsumexp(z, axis=1, keepdims=True)).astype(dtype)
    lse, y = run(
        client,
        sd.logsumexp(da.from_array(lp, chunks=(5, 333))),
        sd.softmax(da.from_array(lp, chunks=(5, 333))),
    )
    mem = softdot.logsumexp(lp, axis=-1)
    uw = 2.0**-51 if dtype == np.float32 else 2.0**-62
    for i in range(lp.shape[0]):
        exact = float(logsumexp_mp(lp[i]))
        slack = uw * abs(float(np.max(lp[i])))
        u = float(ulp(dtype(exact)))
        assert abs(float(lse[i]) - exact) <= 2 * u + slack, (i, lse[i], exact)
        assert abs(float(lse[i]) - float(mem[i])) <= u + slack, (i, lse[i], mem[i])
    # A plain m + log(sum) errs by about eps |m|: far from these tiny values.
    assert np.all(np.abs(lse) < (1e-6 if dtype == np.float32 else 1e-14))
    assert_ulp(y, softmax_ref(lp), 1)


@st.composite
def chunked_case(draw):
    """A 2-d array (entries from a wide range, some -inf, excluded, or NaN)
    with random chunk boundaries on both axes, a temperature and an axis."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rows, n = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = (
        rng.standard_normal((rows, n)) * draw(st.sampled_from([0.1, 3.0, 30.0]))
        + draw(st.sampled_from([0.0, -50.0, 1e3]))
    ).astype(dtype)
    x[rng.random(x.shape) < 0.1] = -np.inf
    keep = rng.random(x.shape) < 0.85
    if draw(st.booleans()):
        x[0, rng.integers(n)] = np.nan

    def cuts(size):
        k = draw(st.integers(0, min(size - 1, 6)))
        edges = (
            sorted(set(rng.choice(np.arange(1, size), size=k, replace=False).tolist())) if k else []
        )
        b = [0] + edges + [size]
        return tuple(b[i + 1] - b[i] for i in range(len(b) - 1))

    chunks = (cuts(rows), cuts(n))
    return x, keep, chunks, draw(st.sampled_from([1.0, 0.5, 3.0])), draw(st.sampled_from([0, 1]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(chunked_case())
def test_random_chunkings_against_memory(case):
    """Any chunking, on the synchronous scheduler (the same bits as on the
    cluster, test_same_bits_for_the_same_chunking): softmax and log_softmax
    within 1 ulp of the in-memory result where it is finite, logsumexp within
    1 ulp, special values (0, -inf, NaN) identical."""
    x, keep, chunks, t, axis = case
    X, W = da.from_array(x, chunks=chunks), da.from_array(keep, chunks=chunks)
    kw = dict(axis=axis, where=W, temperature=t)
    y, ly, lse = dask.compute(
        sd.softmax(X, **kw), sd.log_softmax(X, **kw), sd.logsumexp(X, **kw), scheduler="sync"
    )
    mk = dict(axis=axis, where=keep, temperature=t)
    for got, want, lim in ((y, softdot.softmax(x, **mk), 1), (lse, softdot.logsumexp(x, **mk), 1)):
        fin = np.isfinite(want) & (want != 0)
        assert np.array_equal(got[~fin], want[~fin], equal_nan=True)
        assert_ulp(got[fin], want[fin], lim)
    want = softdot.log_softmax(x, **mk)
    fin = np.isfinite(want)
    assert np.array_equal(ly[~fin], want[~fin], equal_nan=True)
    small = 2.0**-22 if x.dtype == np.float32 else 2.0**-51
    assert np.all(np.abs(ly[fin] - want[fin]) <= np.spacing(np.abs(want[fin])) + small)


def test_errors(client):
    X = da.zeros((3, 4), chunks=2)
    with pytest.raises(ValueError, match=r"softmax: axis 2 is out of range"):
        sd.softmax(X, axis=2)
    with pytest.raises(TypeError, match=r"log_softmax: axis must be an int"):
        sd.log_softmax(X, axis=(0, 1))
    with pytest.raises(ValueError, match=r"logsumexp: temperature must be finite and > 0"):
        sd.logsumexp(X, temperature=0)
    with pytest.raises(ValueError, match=r"softmax: temperature 1e-300 has no finite"):
        sd.softmax(X.astype(np.float32), temperature=1e-300)
    with pytest.raises(ValueError, match=r"softmax: x has shape \(3, 0\): axis 1 is empty"):
        sd.softmax(da.zeros((3, 0)))
    with pytest.raises(ValueError, match=r"softmax: x is 0-d"):
        sd.softmax(da.zeros(()))
    with pytest.raises(TypeError, match=r"softmax: x has dtype float16"):
        sd.softmax(X.astype(np.float16))
    with pytest.raises(TypeError, match=r"softmax: where has dtype int64"):
        sd.softmax(X, where=np.ones((3, 4), np.int64))
    with pytest.raises(ValueError, match=r"softmax: where has shape \(2, 4\), which does not"):
        sd.softmax(X, where=np.ones((2, 4), bool))


def test_import_without_dask():
    code = (
        "import sys\n"
        "sys.modules['dask'] = None\n"
        "import numpy as np, softdot\n"
        "assert softdot.softmax(np.array([0.0, 0.0]))[0] == 0.5\n"
        "try:\n"
        "    import softdot.dask\n"
        "except ImportError as e:\n"
        "    assert \"pip install 'dask[array]'\" in str(e), e\n"
        "    print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
