"""INT8 weight-only quantisation of linear layers (per-output-channel, symmetric).

    scale[o] = max_i |W[o, i]| / 127        W_q = round(W / scale[:, None])  in [-127, 127], int8
    y = x @ (W_q * scale)^T + b             activations stay in float

Weights take a quarter of their float32 bytes (plus one float per output channel).
Small-batch matmuls (decode) use PyTorch's CPU int8 weight kernel
(`torch._weight_int8pack_mm`), which reads the int8 weights directly; larger ones
dequantise the weight for that call. A tied output head (GPT-2's lm_head = wte) is left
in float: quantising it would add a second copy instead of saving memory.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

_PACKED_MAX_ROWS = 4  # up to this many rows the int8 kernel wins; above, dequantise once per call


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight_int8.to(dtype) * self.scales.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if x.device.type == "cpu" and rows <= _PACKED_MAX_ROWS and x.dtype in (torch.float32, torch.bfloat16):
            y = torch._weight_int8pack_mm(x.reshape(rows, self.in_features), self.weight_int8,
                                          self.scales.to(x.dtype)).view(*x.shape[:-1], self.out_features)
            return y + self.bias if self.bias is not None else y
        return F.linear(x, self.dequantized(x.dtype), self.bias)


def quantize_int8(model: nn.Module) -> dict[str, int]:
    """Replace every untied nn.Linear in place; returns {"layers", "bytes_before", "bytes_after"} of their weights."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    before = after = layers = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and id(child.weight) not in tied:
                q = Int8Linear(child)
                setattr(parent, name, q)
                before += child.weight.numel() * child.weight.element_size()
                after += q.weight_int8.numel() + q.scales.numel() * q.scales.element_size()
                layers += 1
    return {"layers": layers, "bytes_before": before, "bytes_after": after}
