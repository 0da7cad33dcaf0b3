"""Every layer's backward vs central finite differences, and forward + backward vs PyTorch autograd.

All checks run in float64 on [B, T, C] inputs (leading dims must work) with a random
upstream gradient R, i.e. the scalar being differentiated is L = sum(layer(x) * R).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.nn import GELU, Dropout, Embedding, LayerNorm, Linear, ReLU, Sequential, numerical_grad, rel_error

B, T, C, H = 2, 3, 5, 4
TOL = 1e-6  # finite differences in float64 with eps 1e-6: observed errors are below 1e-9


def _layers(rng: np.random.Generator) -> dict[str, object]:
    ln = LayerNorm(C, dtype=np.float64)
    # random affine params, so weight/bias gradients are not checked only at the trivial 1/0 point
    ln.params["weight"][...] = rng.normal(1.0, 0.3, C)
    ln.params["bias"][...] = rng.normal(0.0, 0.3, C)
    return {
        "linear": Linear(C, H, dtype=np.float64, rng=rng),
        "linear_nobias": Linear(C, H, bias=False, dtype=np.float64, rng=rng),
        "relu": ReLU(),
        "gelu": GELU(),
        "layernorm": ln,
        "sequential": Sequential(Linear(C, H, dtype=np.float64, rng=rng), GELU(), LayerNorm(H, dtype=np.float64)),
    }


def _input(rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(size=(B, T, C))
    # keep entries away from ReLU's kink so x +- eps never crosses 0 (the derivative is undefined there)
    return np.where(np.abs(x) < 1e-2, 0.5, x)


@pytest.mark.parametrize("name", ["linear", "linear_nobias", "relu", "gelu", "layernorm", "sequential"])
def test_backward_matches_finite_differences(name: str) -> None:
    rng = np.random.default_rng(0)
    layer = _layers(rng)[name]
    x = _input(rng)
    R = rng.normal(size=layer.forward(x).shape)

    layer.zero_grad()
    layer.forward(x)
    dx = layer.backward(R)
    f = lambda: float((layer.forward(x) * R).sum())  # noqa: E731
    assert rel_error(dx, numerical_grad(f, x)) < TOL
    for pname, p in layer.named_parameters():
        analytic = layer.gradients()[pname]
        assert rel_error(analytic, numerical_grad(f, p)) < TOL, pname


def test_embedding_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    emb = Embedding(6, C, dtype=np.float64, rng=rng)
    idx = np.array([[0, 3, 3], [5, 3, 0]])  # repeats: the gradient rows must accumulate
    R = rng.normal(size=(2, 3, C))
    emb.forward(idx)
    assert emb.backward(R) is None
    f = lambda: float((emb.forward(idx) * R).sum())  # noqa: E731
    num = numerical_grad(f, emb.params["weight"])
    assert rel_error(emb.grads["weight"], num) < TOL
    assert np.all(emb.grads["weight"][[1, 2, 4]] == 0)  # unused rows get nothing


def test_dropout_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(B, T, C))
    R = rng.normal(size=x.shape)
    # a fresh layer with the same seed per call draws the same mask, so f is a fixed function of x
    f = lambda: float((Dropout(0.3, seed=7).forward(x) * R).sum())  # noqa: E731
    drop = Dropout(0.3, seed=7)
    drop.forward(x)
    assert rel_error(drop.backward(R), numerical_grad(f, x)) < TOL


def _t(a: np.ndarray, grad: bool = True) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _close(ours: np.ndarray, theirs: torch.Tensor) -> None:
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias: bool) -> None:
    rng = np.random.default_rng(3)
    ours = Linear(C, H, bias=bias, dtype=np.float64, rng=rng)
    ref = torch.nn.Linear(C, H, bias=bias, dtype=torch.float64)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})  # same names
    x, R = rng.normal(size=(B, T, C)), rng.normal(size=(B, T, H))
    xt = _t(x)
    yt = ref(xt)
    yt.backward(torch.from_numpy(R))
    _close(ours.forward(x), yt)
    _close(ours.backward(R), xt.grad)
    _close(ours.grads["weight"], ref.weight.grad)
    if bias:
        _close(ours.grads["bias"], ref.bias.grad)


@pytest.mark.parametrize(
    "ours,fn",
    [(ReLU(), F.relu), (GELU(), lambda t: F.gelu(t, approximate="tanh"))],
    ids=["relu", "gelu_tanh"],
)
def test_activations_match_torch(ours, fn) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(4)
    x, R = rng.normal(scale=3.0, size=(B, T, C)), rng.normal(size=(B, T, C))
    xt = _t(x)
    yt = fn(xt)
    yt.backward(torch.from_numpy(R))
    _close(ours.forward(x), yt)
    _close(ours.backward(R), xt.grad)


def test_layernorm_matches_torch() -> None:
    rng = np.random.default_rng(5)
    ln = LayerNorm(C, dtype=np.float64)
    ln.params["weight"][...] = rng.normal(1.0, 0.3, C)
    ln.params["bias"][...] = rng.normal(0.0, 0.3, C)
    x, R = rng.normal(loc=2.0, scale=3.0, size=(B, T, C)), rng.normal(size=(B, T, C))
    xt, wt, bt = _t(x), _t(ln.params["weight"]), _t(ln.params["bias"])
    yt = F.layer_norm(xt, (C,), wt, bt, eps=1e-5)
    yt.backward(torch.from_numpy(R))
    _close(ln.forward(x), yt)
    _close(ln.backward(R), xt.grad)
    _close(ln.grads["weight"], wt.grad)
    _close(ln.grads["bias"], bt.grad)


def test_embedding_matches_torch() -> None:
    rng = np.random.default_rng(6)
    emb = Embedding(7, C, dtype=np.float64, rng=rng)
    idx = rng.integers(0, 7, size=(B, T))
    R = rng.normal(size=(B, T, C))
    wt = _t(emb.params["weight"])
    yt = F.embedding(torch.from_numpy(idx), wt)
    yt.backward(torch.from_numpy(R))
    _close(emb.forward(idx), yt)
    emb.backward(R)
    _close(emb.grads["weight"], wt.grad)


def test_dropout_semantics() -> None:
    x = np.ones((200, 500))
    d = Dropout(0.25, seed=0)
    y = d.forward(x)
    # inverted dropout: survivors are scaled by 1/(1-p), so the mean is preserved
    assert set(np.unique(y)) == {0.0, 1.0 / 0.75}
    assert abs((y == 0).mean() - 0.25) < 0.01
    assert abs(y.mean() - 1.0) < 0.02
    np.testing.assert_array_equal(d.backward(np.full_like(x, 2.0)), 2.0 * y)  # same mask as forward
    d.eval()
    assert d.forward(x) is x and d.backward(x) is x
    with pytest.raises(ValueError):
        Dropout(1.0)


def test_float32_in_float32_out() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(B, T, C)).astype(np.float32)
    for layer in [Linear(C, C, rng=rng), ReLU(), GELU(), LayerNorm(C), Dropout(0.1)]:
        y = layer.forward(x)
        assert y.dtype == np.float32, type(layer).__name__
        assert layer.backward(np.ones_like(y)).dtype == np.float32, type(layer).__name__
    emb = Embedding(4, C)
    assert emb.params["weight"].dtype == np.float32 and emb.forward(np.array([[1, 2]])).dtype == np.float32


def test_embedding_rejects_bad_indices() -> None:
    emb = Embedding(4, 3)
    with pytest.raises(IndexError):
        emb.forward(np.array([4]))
    with pytest.raises(TypeError):
        emb.forward(np.array([1.0]))
