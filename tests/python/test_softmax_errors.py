"""Errors of the softmax family as a Python user reads them: exact messages
naming the Python function (never the C++ library's softdot::softmax_rows),
TypeError for a numpy array mixed with a torch tensor in one call (x and
where), and the temperature's type (real numbers only: not a string, not a
bool) and range (a finite, non-zero reciprocal in x's dtype)."""

import re

import numpy as np
import pytest
import torch

import softdot
import softdot.torch as st
from softdot import _softdot as core

X64 = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]])
X32 = X64.astype(np.float32)
T64 = torch.from_numpy(X64.copy())
KEEP = np.array([True, False, True])
TKEEP = torch.from_numpy(KEEP.copy())


def raises(exc, message, call):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        call()


# ---- numpy and torch in one call ----------------------------------------------------------

MIXED = [
    ("softmax", lambda w: softdot.softmax(X64, where=w), lambda w: softdot.softmax(T64, where=w)),
    (
        "log_softmax",
        lambda w: softdot.log_softmax(X64, where=w, axis=1),
        lambda w: softdot.log_softmax(T64, where=w, axis=1),
    ),
    (
        "logsumexp",
        lambda w: softdot.logsumexp(X64, where=w, axis=-1),
        lambda w: softdot.logsumexp(T64, where=w, axis=-1),
    ),
    (
        "softmax_state",
        lambda w: softdot.softmax_state(X64[0], where=w),
        lambda w: softdot.softmax_state(T64[0], where=w),
    ),
]


@pytest.mark.parametrize("fn,numpy_call,torch_call", MIXED, ids=[m[0] for m in MIXED])
def test_where_of_the_other_library_is_a_type_error(fn, numpy_call, torch_call):
    raises(
        TypeError,
        f"{fn}: where is a torch.Tensor but x is a numpy array",
        lambda: numpy_call(TKEEP),
    )
    raises(
        TypeError, f"{fn}: where is a numpy array but x is a torch.Tensor", lambda: torch_call(KEEP)
    )
    raises(
        TypeError,
        f"{fn}: where is a numpy array but x is a torch.Tensor",
        lambda: torch_call(np.bool_(True)),
    )
    # Each library's own mask, and a plain list, are accepted and agree.
    a, b, c = numpy_call(KEEP), torch_call(TKEEP), torch_call([True, False, True])
    if isinstance(a, softdot.SoftmaxState):
        assert a == b == c
    else:
        assert np.array_equal(np.asarray(a), b.numpy()) and torch.equal(b, c)


def test_softmax_apply_where_of_the_other_library():
    total = softdot.softmax_state(X64[0])
    raises(
        TypeError,
        "softmax_apply: where is a torch.Tensor but x is a numpy array",
        lambda: softdot.softmax_apply(X64[0], total, where=TKEEP),
    )
    raises(
        TypeError,
        "softmax_apply: where is a numpy array but x is a torch.Tensor",
        lambda: softdot.softmax_apply(T64[0], total, where=KEEP),
    )


# ---- temperature -----------------------------------------------------------------------

TEMPERATURE_FUNCTIONS = [
    ("softmax", lambda x, t: softdot.softmax(x, temperature=t)),
    ("log_softmax", lambda x, t: softdot.log_softmax(x, temperature=t)),
    ("logsumexp", lambda x, t: softdot.logsumexp(x, temperature=t)),
    ("softmax_state", lambda x, t: softdot.softmax_state(x[0], temperature=t)),
    ("softmax", lambda x, t: st.softmax(torch.from_numpy(x), temperature=t)),
    ("log_softmax", lambda x, t: st.log_softmax(torch.from_numpy(x), temperature=t)),
]


@pytest.mark.parametrize("fn,call", TEMPERATURE_FUNCTIONS)
@pytest.mark.parametrize(
    "bad", ["2", b"2", True, False, np.bool_(True), None, [2.0], 2j, torch.tensor(2.0)]
)
def test_temperature_must_be_a_real_number(fn, call, bad):
    raises(
        TypeError, f"{fn}: temperature must be a real number, not {bad!r}", lambda: call(X64, bad)
    )


@pytest.mark.parametrize("fn,call", TEMPERATURE_FUNCTIONS)
def test_temperature_numbers_accepted(fn, call):
    ref = call(X64, 2.0)
    for t in (2, np.float32(2), np.float64(2.0), np.int64(2), np.uint8(2), np.array(2.0)):
        r = call(X64, t)
        if isinstance(ref, softdot.SoftmaxState):
            assert r == ref
        else:
            assert np.array_equal(np.asarray(r), np.asarray(ref)), t


@pytest.mark.parametrize("fn,call", TEMPERATURE_FUNCTIONS)
def test_temperature_reciprocal_must_be_finite_in_the_dtype(fn, call):
    raises(
        ValueError,
        f"{fn}: temperature 1e-45 has no finite, non-zero reciprocal in float32",
        lambda: call(X32, 1e-45),
    )
    raises(
        ValueError,
        f"{fn}: temperature 1e-320 has no finite, non-zero reciprocal in float64",
        lambda: call(X64, 1e-320),
    )
    raises(ValueError, f"{fn}: temperature must be finite and > 0, got -2.0", lambda: call(X64, -2))
    call(X64, 1e-45)  # float64 has the reciprocal of 1e-45


def test_temperature_one_as_a_bool_is_not_the_fast_path():
    raises(
        TypeError,
        "softmax: temperature must be a real number, not True",
        lambda: softdot.softmax(X64, temperature=True),
    )
    raises(
        TypeError,
        "log_softmax: temperature must be a real number, not True",
        lambda: softdot.log_softmax(T64, temperature=True),
    )
    raises(
        TypeError,
        "softmax: axis must be an integer, not -1.0",
        lambda: softdot.softmax(X64, axis=-1.0),
    )


# ---- messages name the Python function, never the C++ one -----------------------------------


def test_core_messages_name_the_python_function():
    """The core's own checks and the library's (whose messages start with
    softdot::<C++ function>) reach Python under the Python function's name."""
    y = np.empty((2, 4))
    cases = [
        (
            lambda: core.softmax_rows(X32, np.empty_like(X32), None, True, 1e-45, False),
            "log_softmax: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        (
            lambda: core.softmax_rows(X64, y, None, False, 1.0, False),
            "softmax: out has shape (2, 4) but x has shape (2, 3)",
        ),
        (
            lambda: core.softmax_strided(X64.T, y.T, None, False, 1.0, False),
            "softmax: out has shape (4, 2) but x has shape (3, 2)",
        ),
        (
            lambda: core.softmax_strided(X32.T, np.empty_like(X32).T, None, False, 1e-45, False),
            "softmax: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        # over 2^18 elements: the error of every block, raised in OpenMP threads
        (
            lambda: core.softmax_strided(
                np.ones((600, 700), np.float32).T,
                np.empty((600, 700), np.float32).T,
                None,
                True,
                1e-45,
                False,
            ),
            "log_softmax: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        (
            lambda: core.logsumexp_rows(X32, np.empty(2, np.float32), None, 1e-45),
            "logsumexp: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        (
            lambda: core.softmax_backward_rows(X64, y, np.empty_like(X64)),
            "softmax_backward: dy has shape (2, 4) but y has shape (2, 3)",
        ),
        (
            lambda: core.state(X32[0], None, 1e-45),
            "softmax_state: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        (
            lambda: core.apply(X32[0], (0.0, 1.0, 0.0), np.empty(3, np.float32), None, 1e-45),
            "softmax_apply: temperature 1e-45 has no finite, non-zero reciprocal in float",
        ),
        (
            lambda: core.dots(X64[0], np.ones((2, 4)), np.empty(2)),
            "dots: keys has shape (2, 4) but query has shape (3,) (keys.shape[1] must equal "
            "len(query))",
        ),
        (
            lambda: core.cross_entropy_rows(X64, np.array([0, 5]), None, None, -100, 0.0, 2),
            "cross_entropy: targets[1] = 5 is not a class in [0, 3) nor ignore_index -100",
        ),
    ]
    for call, message in cases:
        raises(ValueError, message, call)
    raises(
        TypeError,
        "softmax: x must be float32 or float64",
        lambda: core.softmax_rows(X64.astype(np.float16), y, None, False, 1.0, False),
    )
    raises(
        TypeError,
        "dot: x must be float32 or float64",
        lambda: core.dot(np.ones(3, np.float16), np.ones(3, np.float16), False),
    )


def test_public_messages_name_the_python_function():
    raises(
        ValueError,
        "cross_entropy: targets[1] = 7 is not a class in [0, 3) nor ignore_index -100",
        lambda: softdot.cross_entropy(X64, np.array([0, 7])),
    )
    raises(
        ValueError,
        "softmax: temperature 1e-45 has no finite, non-zero reciprocal in float32",
        lambda: softdot.softmax(X32, temperature=1e-45, axis=0),
    )
    for f in (
        softdot.softmax,
        softdot.log_softmax,
        softdot.logsumexp,
        softdot.softmax_backward,
        softdot.cross_entropy,
        softdot.dot,
    ):
        with pytest.raises((TypeError, ValueError)) as e:
            if f is softdot.softmax_backward:
                f(X64, np.ones((2, 4)))
            elif f is softdot.cross_entropy:
                f(X64, np.array([0, 9]))
            elif f is softdot.dot:
                f(X64[0], np.ones(4))
            else:
                f(X32, temperature=1e-45)
        assert str(e.value).startswith(f.__name__ + ": ") and "softdot::" not in str(e.value)


def test_docstrings_state_the_special_values():
    for f in (softdot.softmax, softdot.log_softmax):
        doc = f.__doc__
        assert doc.count("Special values (the C++ library's table") == 1
        assert doc.count("Parameters\n") == 1
    assert softdot.log_softmax.__doc__.startswith("Log of the softmax along an axis")
    assert softdot.softmax.__doc__.startswith("Softmax along an axis")
