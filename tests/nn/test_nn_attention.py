"""Causal self-attention: backward vs finite differences, forward + backward vs torch SDPA (float64)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinystack.nn import numerical_grad, rel_error
from tinystack.nn.attention import CausalSelfAttention

B, T, C, NH = 2, 5, 8, 2


def _attn(seed: int = 0) -> CausalSelfAttention:
    return CausalSelfAttention(C, NH, dtype=np.float64, rng=np.random.default_rng(seed))


def test_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    attn, x = _attn(), rng.normal(size=(B, T, C))
    R = rng.normal(size=(B, T, C))
    attn.zero_grad()
    attn.forward(x)
    dx = attn.backward(R)
    f = lambda: float((attn.forward(x) * R).sum())  # noqa: E731
    assert rel_error(dx, numerical_grad(f, x)) < 1e-6
    for name, p in attn.named_parameters():
        assert rel_error(attn.gradients()[name], numerical_grad(f, p)) < 1e-6, name


def test_matches_torch_autograd() -> None:
    rng = np.random.default_rng(1)
    attn, x = _attn(1), rng.normal(size=(B, T, C))
    R = rng.normal(size=(B, T, C))
    attn.zero_grad()
    out = attn.forward(x)
    dx = attn.backward(R)

    w = {n: torch.tensor(p, requires_grad=True) for n, p in attn.named_parameters()}
    xt = torch.tensor(x, requires_grad=True)
    q, k, v = F.linear(xt, w["c_attn.weight"], w["c_attn.bias"]).split(C, dim=2)
    q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    ref = F.linear(y, w["c_proj.weight"], w["c_proj.bias"])
    (ref * torch.from_numpy(R)).sum().backward()

    assert np.abs(out - ref.detach().numpy()).max() < 1e-12
    assert rel_error(dx, xt.grad.numpy()) < 1e-10
    for name, g in attn.gradients().items():
        assert rel_error(g, w[name].grad.numpy()) < 1e-10, name


def test_is_causal_future_tokens_do_not_change_the_past() -> None:
    rng = np.random.default_rng(2)
    attn, x = _attn(2), rng.normal(size=(1, T, C))
    before = attn.forward(x)
    x2 = x.copy()
    x2[:, -1] += 10.0  # change only the last position
    after = attn.forward(x2)
    assert np.array_equal(before[:, :-1], after[:, :-1])
    assert not np.allclose(before[:, -1], after[:, -1])


def test_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        CausalSelfAttention(10, 3)
