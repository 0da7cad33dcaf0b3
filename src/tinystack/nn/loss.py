"""Softmax cross-entropy: the loss and its gradient in one pass (they share the softmax).

IGNORE_INDEX is the project's one "no target here" value (padding, prompt tokens): PyTorch's and Hugging
Face's -100. It is defined here, in the lowest layer, so the NumPy backend, training and evaluation all
import the same constant (eval.scoring, train.loss).
"""
from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100  # a target the loss skips; F.cross_entropy's default ignore_index


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(logits) against integer targets, and dL/dlogits.

    logits [..., V] (float), targets [...] (ints in [0, V), or IGNORE_INDEX).
    Returns (loss, dlogits) with dlogits shaped and typed like `logits`. Matches
    `F.cross_entropy(logits.view(-1, V), targets.view(-1))` (whose ignore_index is -100 too): the
    mean is over the non-ignored positions, which get zero gradient. If every position is
    ignored the loss is 0.0 with zero gradient (torch returns nan there).

    Numerically stable: log softmax is computed as z - logsumexp(z) after subtracting the
    row max, so huge logits never overflow exp().
    """
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    t = np.asarray(targets).reshape(-1)
    if t.shape[0] != z.shape[0]:
        raise ValueError(f"targets {np.shape(targets)} do not match logits {logits.shape} (leading dims)")
    keep = t != IGNORE_INDEX
    if np.any((t[keep] < 0) | (t[keep] >= V)):
        raise IndexError(f"target out of range [0, {V})")
    n = int(keep.sum())
    dz = np.zeros_like(z)
    if n == 0:
        return 0.0, dz.reshape(logits.shape)

    shifted = z - z.max(axis=-1, keepdims=True)  # softmax is shift invariant; now max exp() is 1
    logsumexp = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    logp = shifted - logsumexp  # log softmax, every entry <= 0
    rows = np.nonzero(keep)[0]
    loss = -logp[rows, t[rows]].sum() / n

    # L = -(1/n) sum_r log p[r, t_r]  ->  dL/dz[r, j] = (p[r, j] - [j == t_r]) / n  for kept rows
    dz[rows] = np.exp(logp[rows])
    dz[rows, t[rows]] -= 1.0
    dz /= n
    return float(loss), dz.reshape(logits.shape)
