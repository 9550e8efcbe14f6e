"""examples/train_tiny.py: a tiny causal LM trained with softdot's attention
learns (its loss falls far below the uniform guess), its loss curve agrees
with the same model's on torch's SDPA, and its run is bitwise the same with
softdot's attention on 1 and on 2 OpenMP threads."""

import importlib.util
import math
import pathlib
import sys

import pytest
import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"


@pytest.fixture(scope="module")
def train_tiny():
    spec = importlib.util.spec_from_file_location("train_tiny", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def one_thread():
    """torch's ops (and so softdot's, one OpenMP runtime) on one thread: the
    2-core machines the tests run on are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def curves(train_tiny):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = train_tiny.Config()
        run = train_tiny.Run(steps=60, log_every=20)
        sd = train_tiny.train(cfg, run, "softdot")
        pt = train_tiny.train(cfg, run, "torch")
    finally:
        torch.set_num_threads(before)
    return cfg, run, sd, pt


def test_data_repeats_its_segment_and_follows_the_chain(train_tiny):
    run = train_tiny.Run()
    data = train_tiny.MarkovData(32, run)
    x = data.batch(50)
    assert x.shape == (50, run.seq_len)
    assert torch.equal(x[:, run.period :], x[:, : -run.period])
    allowed = data.trans > 0
    assert (allowed.sum(1) == run.successors).all()
    assert allowed[x[:, : run.period - 1], x[:, 1 : run.period]].all()


def test_floor_is_the_best_predictors_loss(train_tiny):
    # The loss of the true predictor (the chain in the first segment, exact
    # copies after it) on many samples: the floor within 4 standard errors.
    run = train_tiny.Run()
    data = train_tiny.MarkovData(32, run)
    x = data.batch(4000)
    p = data.trans[x[:, : run.period - 1], x[:, 1 : run.period]]
    per_seq = -p.log().sum(1) / (run.seq_len - 1)
    se = float(per_seq.std()) / math.sqrt(len(per_seq))
    assert abs(float(per_seq.mean()) - data.floor()) < 4 * se
    assert 0.1 < data.floor() < 0.5 * math.log(32)


def test_softdot_learns(curves):
    cfg, run, sd, _ = curves
    assert len(sd.losses) == run.steps
    assert sorted(sd.evals) == [0, 20, 40, 59]
    assert sd.evals[0] > 0.95 * math.log(cfg.vocab)  # starts near a uniform guess
    assert sd.evals[59] < 0.45 * sd.evals[0]
    assert sum(sd.losses[-10:]) / 10 < 0.45 * sd.losses[0]
    assert sd.evals[59] > sd.floor  # and not below the best possible


def test_curves_agree_with_torch(train_tiny, curves):
    cfg, _, sd, pt = curves
    ok, lines = train_tiny.curves_agree(sd, pt, cfg.vocab)
    assert ok, lines
    # The same weights and batch: only the attention's rounding apart.
    assert sd.losses[0] == pytest.approx(pt.losses[0], rel=1e-6)
    dt, de = train_tiny.max_difference(sd, pt)
    assert dt < 0.02 and de < 0.02
    assert sd.digest != pt.digest  # two different attentions did run


def test_criterion_rejects_curves_that_disagree(train_tiny, curves):
    cfg, _, sd, pt = curves
    worse = train_tiny.Result(
        pt.losses, {s: v * 1.2 for s, v in pt.evals.items()}, pt.step_time, "", pt.floor
    )
    assert not train_tiny.curves_agree(sd, worse, cfg.vocab)[0]
    moved = train_tiny.Result(
        [pt.losses[0] * (1 + 1e-4)] + pt.losses[1:], pt.evals, pt.step_time, "", pt.floor
    )
    assert not train_tiny.curves_agree(sd, moved, cfg.vocab)[0]


def test_softdot_threads_reach_the_backward(train_tiny, one_thread):
    # The hooks run softdot's backward on its thread count, and torch's
    # count comes back after it.
    attend = train_tiny.softdot_attention(2)
    q = torch.randn(2, 4, 63, 16, requires_grad=True)
    k = torch.randn(2, 2, 63, 16, requires_grad=True)
    v = torch.randn(2, 2, 63, 16, requires_grad=True)
    o = attend(q, k, v)
    assert torch.get_num_threads() == 1
    seen = []
    o.grad_fn.register_prehook(lambda g: seen.append(torch.get_num_threads()))
    o.sum().backward()
    assert seen == [2]
    assert torch.get_num_threads() == 1
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_bitwise_reproducible_across_thread_counts(train_tiny, capsys):
    run = train_tiny.Run(steps=40)
    a = train_tiny.child_run(run, "softdot", 1, 1)
    b = train_tiny.child_run(run, "softdot", 1, 2)
    assert len(a["losses"]) == 40 and len(a["digest"]) == 64
    assert a == b  # every loss and every weight, bit for bit
    losses = [float.fromhex(h) for h in a["losses"]]
    assert losses[-1] < 0.6 * losses[0]


def test_compare_command_line(train_tiny, one_thread, capsys):
    rc = train_tiny.main(["--compare", "--steps", "40", "--log-every", "10", "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "the curves agree within noise: True" in out
    assert "softdot:" in out and "tokens/s" in out
