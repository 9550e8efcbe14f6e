"""examples/serve_tiny.py: continuous batching over a paged cache with
softdot.write_kv and the ragged paged_attention. With the float32 cache its
greedy tokens are those of the same model in plain torch float32; the int8,
fp8 and bfloat16 caches and seeded sampling run and are reproducible."""

import importlib.util
import pathlib
import sys

import pytest
import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "serve_tiny.py"


@pytest.fixture(scope="module")
def serve_tiny():
    spec = importlib.util.spec_from_file_location("serve_tiny", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_tiny"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model(serve_tiny):
    cfg = serve_tiny.Config()
    return cfg, serve_tiny.make_weights(cfg, seed=0)


def test_greedy_tokens_equal_plain_torch(serve_tiny, model):
    cfg, w = model
    prompts = serve_tiny.prompts_for()
    with torch.no_grad():
        out, steps, _ = serve_tiny.serve(cfg, w, prompts, max_new=12, max_running=3, chunk=16)
        want = [serve_tiny.reference_greedy(cfg, w, pr, 12) for pr in prompts]
    assert out == want
    # Continuous batching: fewer steps than one sequence after another.
    assert steps < sum(1 + (len(pr) + 15) // 16 + 11 for pr in prompts)


@pytest.mark.parametrize("cache", ["bfloat16", "int8", "float8_e4m3fn"])
def test_low_precision_caches_run_and_repeat(serve_tiny, model, cache):
    cfg, w = model
    prompts = serve_tiny.prompts_for()
    with torch.no_grad():
        a, _, _ = serve_tiny.serve(cfg, w, prompts, max_new=6, cache_dtype=cache)
        b, _, _ = serve_tiny.serve(cfg, w, prompts, max_new=6, cache_dtype=cache)
    assert [len(x) for x in a] == [6] * len(prompts)
    assert all(0 <= t < cfg.vocab for x in a for t in x)
    assert a == b  # the same run twice: the same tokens


def test_seeded_sampling_repeats(serve_tiny, model):
    cfg, w = model
    prompts = serve_tiny.prompts_for()
    with torch.no_grad():
        a, _, _ = serve_tiny.serve(cfg, w, prompts, max_new=6, temperature=0.8, seed=3)
        b, _, _ = serve_tiny.serve(
            cfg, w, prompts, max_new=6, temperature=0.8, seed=3, max_running=2
        )
    assert a == b
