"""The learning-rate schedule: linear warmup, then cosine decay to a floor.

This is the ONE definition of the schedule in tinystack: the NumPy backend and the
PyTorch trainer both call `lr_at`, so they cannot drift apart. Pure Python (only
`math`), so the function is trivially usable from any backend.
"""
from __future__ import annotations

import math


def lr_at(step: int, *, max_lr: float, min_lr: float, warmup_iters: int, max_iters: int) -> float:
    """Learning rate for optimiser step `step` (0-based: the rate used by the step-th update).

    With W = warmup_iters and M = max_iters, the three phases, checked in this order:

        step <  W          max_lr * (step + 1) / (W + 1)
                           linear warmup: max_lr/(W+1) at step 0 (small but not 0, so the
                           first update does something), strictly increasing, max_lr*W/(W+1)
                           at step W-1
        step >= M          min_lr
        W <= step < M      min_lr + 0.5 * (1 + cos(pi * (step - W) / (M - W))) * (max_lr - min_lr)
                           cosine decay: exactly max_lr at step W, non-increasing, reaching
                           min_lr at step M (where the previous line takes over, continuously)

    So the peak is max_lr, attained exactly at step W. With W = 0 there is no warmup
    (step 0 gets max_lr); if M <= W there is no decay phase: warmup, then min_lr.

    Raises ValueError if step, warmup_iters or max_iters is negative, or unless
    0 <= min_lr <= max_lr.
    """
    if step < 0 or warmup_iters < 0 or max_iters < 0:
        raise ValueError(f"step={step}, warmup_iters={warmup_iters}, max_iters={max_iters} must be >= 0")
    if not 0.0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")
    if step < warmup_iters:
        return max_lr * (step + 1) / (warmup_iters + 1)
    if step >= max_iters:
        return float(min_lr)
    progress = (step - warmup_iters) / (max_iters - warmup_iters)  # in [0, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
