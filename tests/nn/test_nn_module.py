"""The module system: dotted names (matching torch), tying, zero_grad, train/eval, state dicts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinystack.nn import GELU, Dropout, Embedding, LayerNorm, Linear, Module, ModuleList, Sequential


class _Block(Module):
    """A mini pre-LN transformer block without attention: names as in the PyTorch GPT's Block."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(C, dtype=np.float64)
        self.mlp = Sequential(Linear(C, 4 * C, dtype=np.float64), GELU(), Linear(4 * C, C, dtype=np.float64))
        self.drop = Dropout(0.5)


class _Tiny(Module):
    def __init__(self, V: int = 5, C: int = 3, n_layer: int = 2) -> None:
        super().__init__()
        self.transformer = Module()
        self.transformer.wte = Embedding(V, C, dtype=np.float64)
        self.transformer.h = ModuleList([_Block(C) for _ in range(n_layer)])
        self.lm_head = Linear(C, V, bias=False, dtype=np.float64)
        # weight tying: share the arrays themselves, so both users accumulate into one gradient
        self.lm_head.params["weight"] = self.transformer.wte.params["weight"]
        self.lm_head.grads["weight"] = self.transformer.wte.grads["weight"]


class _TorchTiny(torch.nn.Module):
    def __init__(self, V: int = 5, C: int = 3, n_layer: int = 2) -> None:
        super().__init__()
        blocks = []
        for _ in range(n_layer):
            b = torch.nn.Module()
            b.ln_1 = torch.nn.LayerNorm(C)
            b.mlp = torch.nn.Sequential(torch.nn.Linear(C, 4 * C), torch.nn.GELU(), torch.nn.Linear(4 * C, C))
            b.drop = torch.nn.Dropout(0.5)
            blocks.append(b)
        self.transformer = torch.nn.ModuleDict(dict(wte=torch.nn.Embedding(V, C), h=torch.nn.ModuleList(blocks)))
        self.lm_head = torch.nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


def test_names_and_shapes_match_torch() -> None:
    ours, ref = _Tiny(), _TorchTiny()
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [
        (n, tuple(p.shape)) for n, p in ref.named_parameters()
    ]
    assert "transformer.h.1.mlp.2.bias" in ours.parameters()
    # state dicts list tied weights under both names, in both libraries
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())


def test_load_torch_state_dict() -> None:
    ours, ref = _Tiny(), _TorchTiny().double()
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    for n, p in ref.named_parameters():
        np.testing.assert_array_equal(ours.parameters()[n], p.detach().numpy())
    with pytest.raises(KeyError):
        ours.load_state_dict({"nope": np.zeros(1)})
    with pytest.raises(ValueError):
        ours.load_state_dict({"lm_head.weight": np.zeros((2, 2))}, strict=False)


def test_tied_grads_accumulate_and_zero_grad_keeps_arrays() -> None:
    m = _Tiny()
    grads = m.gradients()
    g = grads["transformer.wte.weight"]
    assert "lm_head.weight" not in grads  # one parameter, listed once under its first name
    m.lm_head.forward(np.ones((2, 3)))
    m.lm_head.backward(np.ones((2, 5)))
    m.transformer.wte.forward(np.array([0, 0]))
    m.transformer.wte.backward(np.ones((2, 3)))
    np.testing.assert_array_equal(g[0], 2.0 + 2.0)  # 2 rows via the head + token 0 twice via the table
    m.zero_grad()
    assert m.gradients()["transformer.wte.weight"] is g and not g.any()


def test_backward_accumulates_until_zero_grad() -> None:
    lin = Linear(3, 2, dtype=np.float64)
    x = np.ones((4, 3))
    lin.forward(x)
    lin.backward(np.ones((4, 2)))
    once = lin.grads["weight"].copy()
    lin.forward(x)
    lin.backward(np.ones((4, 2)))
    np.testing.assert_array_equal(lin.grads["weight"], 2 * once)


def test_train_eval_recurses() -> None:
    m = _Tiny()
    assert m.eval() is m
    assert all(not mod.training for _, mod in m.named_modules())
    m.train()
    assert m.transformer.h[1].drop.training


def test_sequential_rejects_missing_input_grad() -> None:
    s = Sequential(Linear(3, 3), Embedding(3, 3))
    s.items[1].forward(np.array([0]))
    with pytest.raises(RuntimeError):
        s.backward(np.ones((1, 3)))
