"""Mixed precision: which autocast context and gradient scaler a `[train] dtype` means.

    float32   no autocast
    float64   the model is cast to float64, no autocast (for exact comparisons with the NumPy backend)
    bfloat16  autocast to bf16 on CPU or CUDA; bf16 has float32's exponent range, so no scaler
    float16   autocast to fp16, CUDA only, with a GradScaler (fp16 gradients underflow without one)
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

DTYPES = ("float32", "float64", "bfloat16", "float16")


def check_dtype(name: str, device_type: str) -> None:
    if name not in DTYPES:
        raise ValueError(f"train.dtype must be one of {DTYPES}, got {name!r}")
    if name == "float16" and device_type != "cuda":
        raise ValueError("train.dtype='float16' needs CUDA (it relies on a GradScaler); use 'bfloat16' on CPU")


def autocast(name: str, device_type: str) -> ContextManager[object]:
    """The forward-pass context for this dtype (a no-op for float32/float64)."""
    if name in ("bfloat16", "float16"):
        return torch.autocast(device_type=device_type, dtype=getattr(torch, name))
    return contextlib.nullcontext()


def grad_scaler(name: str, device_type: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for float16 (disabled, its methods pass straight through)."""
    return torch.amp.GradScaler(device_type, enabled=(name == "float16"))
