"""SGD / Adam / AdamW / clip_grad_norm vs torch.optim on identical parameters and gradients (float64)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

from tinystack.nn import SGD, Adam, AdamW, clip_grad_norm, default_no_decay

SHAPES = {"w": (4, 3), "b": (3,), "emb": (5, 2)}
LRS = [0.1, 0.1, 0.05, 0.02, 0.2, 0.01]  # changes mid-run: exercises step(lr=...)


def _run(
    make_ours: Callable[[dict, dict], Any],
    make_ref: Callable[[list], torch.optim.Optimizer],
    steps: int,
    no_decay: frozenset[str] | set[str] = frozenset(),
) -> None:
    rng = np.random.default_rng(0)
    params = {n: rng.normal(size=s) for n, s in SHAPES.items()}
    grads = {n: np.zeros(s) for n, s in SHAPES.items()}
    tparams = {n: torch.tensor(p.copy(), requires_grad=True) for n, p in params.items()}
    ours = make_ours(params, grads)
    # torch expresses "no decay for these names" as a second param group with weight_decay 0
    ref = make_ref(
        [
            {"params": [tparams[n] for n in SHAPES if n not in no_decay]},
            {"params": [tparams[n] for n in SHAPES if n in no_decay], "weight_decay": 0.0},
        ]
    )
    for step in range(steps):
        for n in SHAPES:
            g = rng.normal(size=SHAPES[n])
            grads[n][...] = g
            tparams[n].grad = torch.tensor(g)
        for group in ref.param_groups:
            group["lr"] = LRS[step]
        before = {n: g.copy() for n, g in grads.items()}
        ours.step(lr=LRS[step])
        ref.step()
        for n in SHAPES:
            np.testing.assert_allclose(params[n], tparams[n].detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=n)
            np.testing.assert_array_equal(grads[n], before[n])  # optimisers never write gradients


CASES: dict[str, tuple[Callable, Callable, set[str]]] = {
    "sgd": (lambda p, g: SGD(p, g, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1), set()),
    "sgd_momentum_wd": (
        lambda p, g: SGD(p, g, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        set(),
    ),
    "adam": (lambda p, g: Adam(p, g, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.1), set()),
    "adam_l2_betas_eps": (
        lambda p, g: Adam(p, g, lr=0.1, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.1, no_decay={"b"}),
        lambda ps: torch.optim.Adam(ps, lr=0.1, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.1),
        {"b"},
    ),
    "adamw": (lambda p, g: AdamW(p, g, lr=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.1), set()),
    "adamw_no_decay": (
        lambda p, g: AdamW(p, g, lr=0.1, betas=(0.9, 0.99), eps=1e-2, weight_decay=0.5, no_decay={"b", "emb"}),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, betas=(0.9, 0.99), eps=1e-2, weight_decay=0.5),
        {"b", "emb"},
    ),
}


@pytest.mark.parametrize("steps", [1, 6])
@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_matches_torch(case: str, steps: int) -> None:
    make_ours, make_ref, no_decay = CASES[case]
    _run(make_ours, make_ref, steps, no_decay)


def test_adamw_no_decay_really_excludes() -> None:
    # zero gradients: Adam's update is 0, so the only change is the decoupled decay
    p = {"w": np.ones((2, 2)), "b": np.ones(2)}
    g = {n: np.zeros_like(v) for n, v in p.items()}
    AdamW(p, g, lr=0.1, weight_decay=0.5, no_decay=default_no_decay(p)).step()
    np.testing.assert_allclose(p["w"], 1 - 0.1 * 0.5)
    np.testing.assert_array_equal(p["b"], 1.0)
    assert default_no_decay(p) == {"b"}


def test_optimizer_validation_and_float32() -> None:
    p = {"w": np.ones(3, dtype=np.float32)}
    with pytest.raises(ValueError):
        AdamW(p, {"v": np.ones(3)})
    with pytest.raises(ValueError):
        AdamW(p, {"w": np.ones(4)})
    with pytest.raises(ValueError):
        AdamW(p, {"w": np.ones(3)}, no_decay={"typo"})
    opt = AdamW(p, {"w": np.ones(3, dtype=np.float32)}, lr=0.1)
    w = p["w"]
    opt.step()
    assert p["w"] is w and w.dtype == np.float32 and np.all(w < 1)  # updated in place, dtype kept


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm: float) -> None:
    rng = np.random.default_rng(1)
    grads = {n: rng.normal(size=s) for n, s in SHAPES.items()}
    tensors = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES.values()]
    for t, g in zip(tensors, grads.values()):
        t.grad = torch.tensor(g.copy())
    total = clip_grad_norm(grads, max_norm)
    ref_total = torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    assert abs(total - ref_total.item()) < 1e-12
    for t, g in zip(tensors, grads.values()):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-15)
    new_norm = np.sqrt(sum((g**2).sum() for g in grads.values()))
    assert new_norm <= max_norm + 1e-9


def test_clip_grad_norm_counts_tied_arrays_once() -> None:
    g = np.full(4, 3.0)  # norm 6
    assert clip_grad_norm([g, g], 1.0) == pytest.approx(6.0)
    np.testing.assert_allclose(np.linalg.norm(g), 1.0, rtol=1e-6)
