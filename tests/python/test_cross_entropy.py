"""softdot.cross_entropy against torch.nn.functional.cross_entropy (the loss
for every reduction, ignore_index and label smoothing, and the gradient
against torch's autograd in float64), numpy and torch in and out, the
special values softdot defines, and the errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softdot


def torch_reference(x, t, **kw):
    """torch's loss and autograd gradient in float64 (the reference)."""
    xd = x.detach().double().clone().requires_grad_(True)
    loss = F.cross_entropy(xd, t, **kw)
    (loss.sum() if loss.ndim else loss).backward()
    return loss.detach(), xd.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
def test_against_torch(rng, dtype, reduction, eps):
    n, c = 9, 37
    x = torch.from_numpy(rng.standard_normal((n, c)) * 4).to(dtype)
    t = torch.from_numpy(rng.integers(0, c, n)).long()
    t[3] = -100
    t[5] = 7
    before = x.clone()
    loss, grad = softdot.cross_entropy(x, t, label_smoothing=eps, reduction=reduction, grad=True)
    assert torch.equal(x, before)
    assert isinstance(loss, torch.Tensor) and loss.dtype == dtype
    assert isinstance(grad, torch.Tensor) and grad.dtype == dtype and grad.shape == x.shape
    ref_loss, ref_grad = torch_reference(x, t, label_smoothing=eps, reduction=reduction)
    tol = 2e-7 if dtype == torch.float32 else 1e-15
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=tol, atol=tol)
    # torch in the same dtype agrees to its own rounding.
    torch.testing.assert_close(
        loss,
        F.cross_entropy(x, t, label_smoothing=eps, reduction=reduction),
        rtol=1e-5 if dtype == torch.float32 else 1e-12,
        atol=1e-6 if dtype == torch.float32 else 1e-13,
    )
    assert torch.all(grad[3] == 0)


def test_numpy_and_ignore_index(rng):
    x = rng.standard_normal((6, 5))
    t = np.array([0, 4, 2, 2, 1, 3], dtype=np.int32)
    loss = softdot.cross_entropy(x, t, ignore_index=2, reduction="none")
    assert isinstance(loss, np.ndarray) and loss.dtype == np.float64 and loss.shape == (6,)
    ref, _ = torch_reference(
        torch.from_numpy(x), torch.from_numpy(t).long(), ignore_index=2, reduction="none"
    )
    np.testing.assert_allclose(loss, ref.numpy(), rtol=1e-15, atol=1e-16)
    assert loss[2] == 0 and loss[3] == 0
    m = softdot.cross_entropy(x, t, ignore_index=2)
    assert isinstance(m, np.float64)
    np.testing.assert_allclose(m, ref.numpy().sum() / 4, rtol=1e-15)
    # One row: 1-d logits and a 0-d target.
    one, g = softdot.cross_entropy(x[1], np.int64(4), grad=True)
    np.testing.assert_allclose(one, loss[1], rtol=1e-15)
    assert g.shape == (5,)
    # Strided rows (every other row), no copy needed.
    xs = rng.standard_normal((8, 5)).astype(np.float32)[::2]
    ls = softdot.cross_entropy(xs, np.array([1, 2, 3, 4]), reduction="none")
    ref_s, _ = torch_reference(
        torch.from_numpy(np.ascontiguousarray(xs)), torch.tensor([1, 2, 3, 4]), reduction="none"
    )
    np.testing.assert_allclose(ls, ref_s.numpy(), rtol=2e-7)


def test_all_ignored_mean_is_nan():
    x = np.zeros((2, 3), dtype=np.float32)
    loss, g = softdot.cross_entropy(x, np.array([-100, -100]), grad=True)
    assert np.isnan(loss)
    assert np.all(g == 0)


def test_special_values():
    inf = np.inf
    x = np.array([[0.0, -inf, 1.0], [-inf, -inf, -inf], [0.0, np.nan, 1.0]])
    loss, g = softdot.cross_entropy(x, np.array([1, 0, 2]), reduction="none", grad=True)
    assert loss[0] == inf and loss[1] == inf and np.isnan(loss[2])
    np.testing.assert_array_equal(g[1], [-1.0, 0.0, 0.0])  # torch gives NaN here
    assert np.all(np.isnan(g[2]))
    assert np.all(np.isfinite(g[0]))


def test_errors():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"targets\[1\] = 3"):
        softdot.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="label_smoothing"):
        softdot.cross_entropy(x, np.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        softdot.cross_entropy(x, np.array([0, 1]), reduction="avg")
    with pytest.raises(TypeError, match="targets"):
        softdot.cross_entropy(x, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="targets"):
        softdot.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="torch"):
        softdot.cross_entropy(torch.zeros(2, 3), np.array([0, 1]))
    with pytest.raises(NotImplementedError, match="requires grad"):
        softdot.cross_entropy(torch.zeros(2, 3, requires_grad=True), torch.tensor([0, 1]))


def test_strided_and_column_major_layouts(rng):
    """Column-strided and column-major tensors give torch's values."""
    x = torch.from_numpy(rng.standard_normal((4, 10)))
    t = torch.tensor([0, 9, 3, 4])
    for v in (x[:, ::2], x.T.contiguous().T):
        tt = t.clamp(max=v.shape[1] - 1)
        torch.testing.assert_close(
            softdot.cross_entropy(v, tt), F.cross_entropy(v, tt), rtol=1e-15, atol=1e-15
        )
