"""Finite-difference gradient checking: how every hand-written backward is verified.

Used by the tests (and by whoever writes the next backward, e.g. attention): compute
the analytic gradient with `backward`, the numerical one with `numerical_grad`, and
require `rel_error` to be tiny. Do it in float64; float32 has too few digits for
central differences to mean anything.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def numerical_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar f() w.r.t. every entry of `x` (perturbed in place,
    restored afterwards): df/dx_i ~ (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), error O(eps^2).

    `f` must read `x` itself (close over it), e.g. `lambda: float((layer.forward(x) * r).sum())`.
    Returns an array shaped like `x`. Cost: 2 * x.size calls of f.
    """
    grad = np.zeros(x.shape, dtype=np.float64)
    flat = x.reshape(-1)  # a view: writing it perturbs x
    assert np.shares_memory(flat, x), "x must be contiguous"
    g = grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        f_plus = f()
        flat[i] = old - eps
        f_minus = f()
        flat[i] = old
        g[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """Max relative error between two gradients, relative to their scale:

        max_i |a_i - b_i| / max(max_i |a_i|, max_i |b_i|, 1e-30)

    Scale-relative rather than elementwise so that entries which happen to be ~0 (where
    finite-difference noise is as large as the value) cannot dominate; every entry is
    still compared, and the result is 0 only if the arrays are identical.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale
