"""MLP: full parameter gradients vs the same network in torch; training on spirals with Adam."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.nn import MLP, Adam, numerical_grad, rel_error


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_mlp_grads_match_torch(activation: str) -> None:
    rng = np.random.default_rng(0)
    sizes = [4, 16, 8, 3]
    ours = MLP(sizes, activation=activation, dtype=np.float64, seed=1)
    act = torch.nn.ReLU if activation == "relu" else lambda: torch.nn.GELU(approximate="tanh")
    ref = torch.nn.Sequential(
        torch.nn.Linear(4, 16), act(), torch.nn.Linear(16, 8), act(), torch.nn.Linear(8, 3)
    ).double()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})  # same names

    x, y = rng.normal(size=(10, 4)), rng.integers(0, 3, size=10)
    loss, grads = ours.loss_and_grads(x, y)
    ref_loss = F.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
    ref_loss.backward()
    assert abs(loss - ref_loss.item()) < 1e-12
    ref_grads = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    assert list(grads) == list(ref_grads)
    for n in grads:
        np.testing.assert_allclose(grads[n], ref_grads[n], rtol=1e-10, atol=1e-13, err_msg=n)

    # and the whole chain once more against finite differences. Copy first: `grads` are the
    # model's live gradient arrays, which every loss_and_grads call inside the FD loop rewrites
    analytic = {n: g.copy() for n, g in grads.items()}
    for n, p in ours.parameters().items():
        num = numerical_grad(lambda: ours.loss_and_grads(x, y)[0], p)
        assert rel_error(analytic[n], num) < 1e-6, n


def _spirals(n_per_class: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved 2-D spiral arms, one per class (the classic non-linearly-separable toy set)."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for k in range(n_classes):
        r = np.linspace(0.05, 1.0, n_per_class)
        theta = np.linspace(k * 2 * np.pi / n_classes, k * 2 * np.pi / n_classes + 4.0, n_per_class)
        theta = theta + rng.normal(scale=0.15, size=n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, k))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def _train(sizes: list[int], x: np.ndarray, y: np.ndarray, steps: int) -> MLP:
    model = MLP(sizes, activation="relu", seed=0)  # float32, the training dtype
    opt = Adam(model.parameters(), model.gradients(), lr=1e-2)
    for _ in range(steps):
        model.loss_and_grads(x, y)
        opt.step()
    return model


def test_mlp_learns_spirals_a_linear_model_cannot() -> None:
    x, y = _spirals(100, 3, seed=0)
    x_test, y_test = _spirals(100, 3, seed=1)  # fresh noise: a held-out set
    mlp = _train([2, 64, 64, 3], x, y, steps=300)
    linear = _train([2, 3], x, y, steps=300)
    assert mlp.parameters()["0.weight"].dtype == np.float32
    train_acc, test_acc = (mlp.predict(x) == y).mean(), (mlp.predict(x_test) == y_test).mean()
    linear_acc = (linear.predict(x) == y).mean()
    assert train_acc >= 0.97 and test_acc >= 0.95, (train_acc, test_acc)
    assert linear_acc < 0.7, linear_acc  # the task really needs the hidden layers
