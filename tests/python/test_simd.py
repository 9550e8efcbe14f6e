"""SIMD dispatch and version: simd_targets() holds simd_target(); forcing
each other target (always restored) keeps softmax within its bound and, on
FMA targets (AVX2, AVX3/AVX-512, NEON...), gives the same bits for dot and
attention; the package version matches the installed metadata."""

import importlib.metadata

import numpy as np
import pytest

import softdot

from conftest import FLOATS, assert_ulp, log_softmax_ref, softmax_ref

# Targets whose dot and attention are documented to give the same bits (FMA).
FMA_TARGETS = {
    "AVX3",
    "AVX3_ZEN4",
    "AVX3_SPR",
    "AVX10_2",
    "AVX2",
    "NEON",
    "NEON_BF16",
    "SVE",
    "SVE2",
    "SVE_256",
    "SVE2_128",
}


def test_version():
    assert softdot.__version__ == importlib.metadata.version("softdot")
    assert softdot.__version__.count(".") == 2


def test_targets_list():
    targets = softdot.simd_targets()
    assert isinstance(targets, list) and all(isinstance(t, str) for t in targets)
    assert softdot.simd_target() in targets
    assert len(set(targets)) == len(targets)


def test_force_and_restore(restore_simd):
    default = softdot.simd_target()
    for t in softdot.simd_targets():
        softdot.force_simd_target(t)
        assert softdot.simd_target() == t
    softdot.force_simd_target("")
    assert softdot.simd_target() == default


def test_avx2_softmax_within_bound(rng, restore_simd):
    if "AVX2" not in softdot.simd_targets():
        pytest.skip("this CPU has no AVX2")  # reported, never silent
    xs = {d: (rng.standard_normal((16, 300)) * 5).astype(d) for d in FLOATS}
    default = {d: softdot.softmax(x) for d, x in xs.items()}
    softdot.force_simd_target("AVX2")
    try:
        assert softdot.simd_target() == "AVX2"
        for d, x in xs.items():
            y = softdot.softmax(x)
            assert_ulp(y, softmax_ref(x), 1)
            assert_ulp(y, default[d], 1)
            assert_ulp(softdot.softmax(x, precision="fast"), softmax_ref(x), 2)
            assert_ulp(softdot.log_softmax(x), log_softmax_ref(x), 2)
    finally:
        softdot.force_simd_target("")
    assert softdot.simd_target() == softdot.simd_targets()[0]


def test_every_target_bounds_and_fma_bits(rng, restore_simd):
    x = {d: (rng.standard_normal((8, 257)) * 5).astype(d) for d in FLOATS}
    a = {d: rng.standard_normal(1000).astype(d) for d in FLOATS}
    b = {d: rng.standard_normal(1000).astype(d) for d in FLOATS}
    q = rng.standard_normal((1, 2, 20, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, 70, 32)).astype(np.float32)
    q1 = q[:, :, :1]
    base_dot = {
        d: (softdot.dot(a[d], b[d]), softdot.dot(a[d], b[d], accurate=True)) for d in FLOATS
    }
    base_att = softdot.scaled_dot_product_attention(q, k, k, causal=True)
    base_dec = softdot.scaled_dot_product_attention(q1, k, k)
    default = softdot.simd_target()
    try:
        for t in softdot.simd_targets():
            softdot.force_simd_target(t)
            for d in FLOATS:
                assert_ulp(softdot.softmax(x[d]), softmax_ref(x[d]), 1)
                # The fast path's bound without FMA is 2.5 ulp: 3 from the
                # rounded reference.
                assert_ulp(softdot.softmax(x[d], precision="fast"), softmax_ref(x[d]), 3)
            if t in FMA_TARGETS and default in FMA_TARGETS:
                for d in FLOATS:
                    assert softdot.dot(a[d], b[d]) == base_dot[d][0], t
                    assert softdot.dot(a[d], b[d], accurate=True) == base_dot[d][1], t
                np.testing.assert_array_equal(
                    softdot.scaled_dot_product_attention(q, k, k, causal=True), base_att
                )
                np.testing.assert_array_equal(
                    softdot.scaled_dot_product_attention(q1, k, k), base_dec
                )
    finally:
        softdot.force_simd_target("")
