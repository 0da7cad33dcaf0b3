"""Fusing linear layers that read the same input into one, for inference: one matmul instead of several.

    fuse_rows(attn, ["q_proj", "k_proj", "v_proj"], "qkv_proj") -> True
        attn.qkv_proj(x) == cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)   (the old layers go)

A linear layer's output features are the rows of its weight, so the fused weight is the layers'
rows stacked (bias likewise): the same numbers, read in one pass. That holds for any layer whose
tensors are all indexed by output row along their first dimension: nn.Linear, and the quantised
QuantLinear (its blocks are per row), which provides `concat(layers)` -> one layer.

The checkpoint format does not change: the parent's state_dict still names the tensors by the
original layers (`q_proj.weight`, ...: the fused tensor split by rows, copies so safetensors can
save them) and load_state_dict accepts those names. The inference engine applies it once at load
(model.fuse_projections()), the trainer before training (train/finetune.py: fewer, larger matmuls in the
forward and both halves of the backward). `parent.fused_parts[fused_name]` records (names, sizes), so a
LoRA adapter on the fused layer (train/lora.py) can keep one adapter per original layer; while such a wrapper
sits there, state_dict keeps the in-memory names (a wrapper's tensors are not all indexed by output row).
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _fusable(layer: nn.Module) -> bool:
    """A type whose tensors are all indexed by output row: nn.Linear (or a subclass that keeps its tensors, as
    the trainer's PlannedLinear), or one that provides `concat`."""
    return isinstance(layer, nn.Linear) or hasattr(type(layer), "concat")


def _concat(layers: list[nn.Module]) -> nn.Module | None:
    first = layers[0]
    if all(type(m) is nn.Linear for m in layers):
        if len({m.bias is None for m in layers}) != 1 or len({m.in_features for m in layers}) != 1:
            return None
        fused = nn.Linear(first.in_features, sum(m.out_features for m in layers), bias=first.bias is not None,
                          device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([m.weight for m in layers]))
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([m.bias for m in layers]))
        fused.requires_grad_(first.weight.requires_grad)
        return fused
    if all(type(m) is type(first) for m in layers) and hasattr(type(first), "concat"):
        return type(first).concat(layers)
    return None  # e.g. a LoRA wrapper: left as it is


def fuse_rows(parent: nn.Module, names: list[str], fused_name: str) -> bool:
    """Replace `parent`'s layers `names` by one layer `fused_name` whose output is theirs side by side.

    Returns False (and changes nothing) where the layers cannot be fused: different types or inputs,
    or a type without a row concatenation."""
    layers = [getattr(parent, n) for n in names]
    fused = _concat(layers)
    if fused is None:
        return False
    sizes = [m.out_features for m in layers]
    for n in names:
        delattr(parent, n)
    setattr(parent, fused_name, fused)
    head = f"{fused_name}."

    def split(module, state_dict, prefix, local_metadata):  # fused tensors -> the original layers' names
        if not _fusable(getattr(module, fused_name)):  # a wrapper (LoRA): its tensors keep their names
            return
        for key in [k for k in state_dict if k.startswith(prefix + head)]:
            field = key[len(prefix + head):]
            for name, part in zip(names, state_dict.pop(key).split(sizes)):
                state_dict[f"{prefix}{name}.{field}"] = part.clone()

    def join(module, state_dict, prefix, *args):  # the original layers' names -> fused tensors
        fields = {k[len(prefix + names[0]) + 1:] for k in state_dict if k.startswith(f"{prefix}{names[0]}.")}
        for field in fields:
            keys = [f"{prefix}{name}.{field}" for name in names]
            if all(k in state_dict for k in keys):
                state_dict[prefix + head + field] = torch.cat([state_dict.pop(k) for k in keys])

    if not hasattr(parent, "fused_parts"):
        parent.fused_parts = {}
    parent.fused_parts[fused_name] = (list(names), sizes)
    parent.register_state_dict_post_hook(split)
    parent.register_load_state_dict_pre_hook(join)
    return True
