"""softmax_cross_entropy: finite differences, PyTorch's F.cross_entropy, stability, IGNORE_INDEX (-100)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.nn import numerical_grad, rel_error, softmax_cross_entropy
from tinystack.nn.loss import IGNORE_INDEX

B, T, V = 2, 4, 7


def _torch_ce(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    zt = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    loss = F.cross_entropy(zt.view(-1, logits.shape[-1]), torch.from_numpy(targets).view(-1), ignore_index=-100)
    loss.backward()
    return loss.item(), zt.grad.numpy()


@pytest.mark.parametrize("ignore", [False, True])
def test_matches_finite_differences(ignore: bool) -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(scale=2.0, size=(B, T, V))
    y = rng.integers(0, V, size=(B, T))
    if ignore:
        y[0, 1] = y[1, 3] = IGNORE_INDEX
    _, dz = softmax_cross_entropy(z, y)
    num = numerical_grad(lambda: softmax_cross_entropy(z, y)[0], z)
    assert rel_error(dz, num) < 1e-6
    if ignore:
        assert np.all(dz[0, 1] == 0) and np.all(dz[1, 3] == 0)


@pytest.mark.parametrize("ignore", [False, True])
def test_matches_torch(ignore: bool) -> None:
    rng = np.random.default_rng(1)
    z = rng.normal(scale=3.0, size=(B, T, V))
    y = rng.integers(0, V, size=(B, T))
    if ignore:
        y[1, :2] = IGNORE_INDEX
    loss, dz = softmax_cross_entropy(z, y)
    ref_loss, ref_dz = _torch_ce(z, y)  # F.cross_entropy with ignore_index=-100: the same positions skipped
    assert abs(loss - ref_loss) < 1e-12
    np.testing.assert_allclose(dz, ref_dz, rtol=1e-10, atol=1e-14)


def test_huge_logits_are_stable() -> None:
    z = np.array([[1000.0, 0.0, -1000.0], [-5e4, 5e4, 0.0], [800.0, 800.0, 800.0]])
    y = np.array([1, 1, 2])
    loss, dz = softmax_cross_entropy(z, y)
    ref_loss, ref_dz = _torch_ce(z, y)
    assert np.isfinite(loss) and np.all(np.isfinite(dz))
    assert abs(loss - ref_loss) < 1e-9
    np.testing.assert_allclose(dz, ref_dz, atol=1e-12)


def test_float32_keeps_dtype() -> None:
    z = np.random.default_rng(2).normal(size=(3, 5)).astype(np.float32)
    loss, dz = softmax_cross_entropy(z, np.array([0, 4, 2]))
    assert dz.dtype == np.float32 and isinstance(loss, float)
    np.testing.assert_allclose(dz.sum(axis=-1), 0.0, atol=1e-6)  # softmax rows sum to 1, one-hot too


def test_all_ignored_and_bad_targets() -> None:
    z = np.zeros((2, 3))
    loss, dz = softmax_cross_entropy(z, np.array([IGNORE_INDEX, IGNORE_INDEX]))
    assert loss == 0.0 and not dz.any()
    with pytest.raises(IndexError):
        softmax_cross_entropy(z, np.array([0, 3]))
    with pytest.raises(IndexError):  # -1 is not a "no target" value (only IGNORE_INDEX is): out of range
        softmax_cross_entropy(z, np.array([0, -1]))
    with pytest.raises(ValueError):
        softmax_cross_entropy(z, np.array([0, 1, 2]))
