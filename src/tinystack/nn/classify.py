"""Training the NumPy MLP classifier: shuffled mini-batches, AdamW, the shared warmup+cosine schedule.

    for each epoch: permute the rows (seeded) -> batches of `batch_size`
        loss_and_grads -> clip_grad_norm -> AdamW.step(lr_at(step))
    after each epoch: accuracy on (x_val, y_val) if given
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tinystack.nn.mlp import MLP
from tinystack.nn.optim import AdamW, clip_grad_norm, default_no_decay
from tinystack.nn.schedule import lr_at


@dataclass
class FitResult:
    losses: list[float] = field(default_factory=list)  # mean train loss per epoch
    val_accuracy: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)


def accuracy(model: MLP, x: np.ndarray, y: np.ndarray) -> float:
    return float((model.predict(x) == y).mean())


def fit(model: MLP, x: np.ndarray, y: np.ndarray, *, epochs: int = 10, batch_size: int = 128, lr: float = 3e-3,
        min_lr: float = 3e-4, warmup_steps: int = 20, weight_decay: float = 1e-4, grad_clip: float = 1.0,
        seed: int = 0, x_val: np.ndarray | None = None, y_val: np.ndarray | None = None) -> FitResult:
    """Train `model` in place; returns per-epoch loss, validation accuracy and wall time."""
    params = model.parameters()
    opt = AdamW(params, model.gradients(), lr=lr, weight_decay=weight_decay, no_decay=default_no_decay(params))
    rng = np.random.default_rng(seed)
    steps_per_epoch = -(-len(x) // batch_size)
    total, step, out = epochs * steps_per_epoch, 0, FitResult()
    model.train()
    for _ in range(epochs):
        t0, losses = time.perf_counter(), []
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch_size):
            rows = order[i:i + batch_size]
            loss, grads = model.loss_and_grads(x[rows], y[rows])
            if grad_clip > 0:
                clip_grad_norm(grads, grad_clip)
            opt.step(lr_at(step, max_lr=lr, min_lr=min_lr, warmup_iters=warmup_steps, max_iters=total))
            losses.append(loss)
            step += 1
        out.epoch_seconds.append(time.perf_counter() - t0)
        out.losses.append(float(np.mean(losses)))
        if x_val is not None and y_val is not None:
            out.val_accuracy.append(accuracy(model, x_val, y_val))
    model.eval()
    return out
