"""Optimisers (SGD, Adam, AdamW) and global-norm gradient clipping, equal to torch's.

An optimiser holds references to two dicts with the same keys, {name: parameter} and
{name: gradient} (a model's `parameters()` / `gradients()`), and updates the parameter
arrays IN PLACE on `step()`; it never writes the gradients. Each update below is
written exactly as torch.optim does it (torch 2.x, default flags: no nesterov, no
amsgrad, no maximize), so runs agree with torch to rounding error.

Weight decay can skip names: pass `no_decay` (a set of parameter names, typically
`default_no_decay(params)` = biases and norm weights, plus embeddings if wanted).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np


def default_no_decay(params: Mapping[str, np.ndarray]) -> set[str]:
    """Names of parameters with fewer than 2 dims (biases, LayerNorm weight/bias): the usual
    set to exclude from weight decay (GPT-2 / nanoGPT rule). Add embedding names to it to
    exclude those too."""
    return {n for n, p in params.items() if p.ndim < 2}


class Optimizer:
    """Shared plumbing: validated param/grad dicts, lr, weight decay with exclusions, step count."""

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        lr: float,
        weight_decay: float = 0.0,
        no_decay: Iterable[str] = (),
    ) -> None:
        if params.keys() != grads.keys():
            raise ValueError(f"params and grads must have the same names: {sorted(params.keys() ^ grads.keys())}")
        for n in params:
            if params[n].shape != grads[n].shape:
                raise ValueError(f"{n}: param shape {params[n].shape} != grad shape {grads[n].shape}")
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"lr and weight_decay must be >= 0, got {lr}, {weight_decay}")
        excluded = set(no_decay)
        unknown = excluded - params.keys()
        if unknown:  # a typo here would silently decay what was meant to be excluded
            raise ValueError(f"no_decay names not among the parameters: {sorted(unknown)}")
        self.params, self.grads = dict(params), dict(grads)
        self.lr, self.weight_decay, self.no_decay = lr, weight_decay, excluded
        self.t = 0  # number of steps taken

    def decay(self, name: str) -> float:
        """The weight decay that applies to this parameter (0 for excluded names)."""
        return 0.0 if name in self.no_decay else self.weight_decay

    def step(self, lr: float | None = None) -> None:
        """One update of every parameter. `lr`, if given, becomes the learning rate from now on
        (the way a schedule drives it: `opt.step(lr_at(it, ...))`)."""
        if lr is not None:
            self.lr = lr
        self.t += 1
        for name, p in self.params.items():
            self._update(name, p, self.grads[name])

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0)


class SGD(Optimizer):
    """torch.optim.SGD (dampening 0, no nesterov):
        g = grad + wd * p;   buf = g on the first step, else momentum * buf + g;   p -= lr * buf
    (with momentum 0: p -= lr * g). Weight decay here is L2 added to the gradient.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        no_decay: Iterable[str] = (),
    ) -> None:
        super().__init__(params, grads, lr, weight_decay, no_decay)
        self.momentum = momentum
        self.buf: dict[str, np.ndarray] = {}

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> None:
        wd = self.decay(name)
        if wd:
            g = g + wd * p
        if self.momentum:
            if name not in self.buf:
                self.buf[name] = g.copy()
            else:
                self.buf[name] *= self.momentum
                self.buf[name] += g
            g = self.buf[name]
        p -= self.lr * g


class Adam(Optimizer):
    """torch.optim.Adam (no amsgrad). With t = step count:
        g = grad + wd * p                       (L2: the decay goes through the moments)
        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    i.e. eps is added to the bias-corrected sqrt(v_hat), not inside the square root.
    """

    decoupled = False

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        no_decay: Iterable[str] = (),
    ) -> None:
        super().__init__(params, grads, lr, weight_decay, no_decay)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.m = {n: np.zeros_like(p) for n, p in self.params.items()}
        self.v = {n: np.zeros_like(p) for n, p in self.params.items()}

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> None:
        wd = self.decay(name)
        if wd and self.decoupled:
            p *= 1.0 - self.lr * wd  # AdamW: shrink the weights directly, outside the moments
        elif wd:
            g = g + wd * p
        m, v, b1, b2 = self.m[name], self.v[name], self.beta1, self.beta2
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        step_size = self.lr / (1.0 - b1**self.t)
        denom = np.sqrt(v) / math.sqrt(1.0 - b2**self.t) + self.eps
        p -= step_size * (m / denom)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, applied before the Adam update:
        p *= 1 - lr * wd;   then the Adam step above with g = grad (no L2 term).
    Default weight_decay 0.01 as in torch; names in `no_decay` are not decayed.
    """

    decoupled = True

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        no_decay: Iterable[str] = (),
    ) -> None:
        super().__init__(params, grads, lr, betas, eps, weight_decay, no_decay)


def clip_grad_norm(grads: Mapping[str, np.ndarray] | Iterable[np.ndarray], max_norm: float) -> float:
    """Scale all gradients in place so their global L2 norm is at most `max_norm`.

    Returns the total norm BEFORE clipping: sqrt(sum over all arrays of sum(g^2)). As in
    torch.nn.utils.clip_grad_norm_, the scale is max_norm / (total + 1e-6), applied only
    when it is < 1. An array listed twice (tied weights) is counted once.
    """
    arrays = list(grads.values()) if isinstance(grads, Mapping) else list(grads)
    unique = list({id(g): g for g in arrays}.values())
    total = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in unique))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in unique:
            g *= coef
    return total
