"""A frozen weight in the compute dtype, cast once and kept while the weight is unchanged.

Under bf16 autocast every product re-casts its float32 weight each step (autocast keeps casts only within one
forward, and only for weights that require grad). A weight that never trains need not be (QLoRA's observation):
LoRA's frozen base (train/lora.py) and a frozen output head (train/frozen_head.py) take their copy from here.

    compute_dtype(weight, device) -> the dtype a product with `weight` runs in on `device` ("cpu", "cuda"):
                                autocast's when it is on there (a floating weight), else the weight's own
    kept_cast(weight, dtype) -> the weight in `dtype`, contiguous: a copy made once and again only when the weight
                                changes (its version counter moves: an in-place write, load_state_dict; or its
                                storage is replaced), or the weight itself (detached) when it is in `dtype`.
                                A weight that requires grad changes every step: cast each call, never kept.

One copy per weight (the dtype last asked for), held as long as the weight lives.
"""
from __future__ import annotations

import weakref

import torch

_kept: dict[int, tuple] = {}  # id(weight) -> (weakref to it, what the copy depends on, the copy)


def compute_dtype(weight: torch.Tensor, device: str) -> torch.dtype:
    if torch.is_autocast_enabled(device) and weight.dtype.is_floating_point:
        return torch.get_autocast_dtype(device)
    return weight.dtype


def kept_cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if weight.requires_grad:
        return weight.detach().to(dtype).contiguous()
    same = dtype == weight.dtype  # the weight itself: writes to it are its own, so no version is needed
    state = (weight.data_ptr(), weight.device, dtype, None if same else weight._version)
    key = id(weight)
    cached = _kept.get(key)
    if cached is None or cached[0]() is not weight or cached[1] != state:
        ref = weakref.ref(weight, lambda _, key=key: _kept.pop(key, None))
        cached = _kept[key] = (ref, state, weight.detach().to(dtype).contiguous())
    return cached[2]
