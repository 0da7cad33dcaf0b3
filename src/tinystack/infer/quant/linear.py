"""Linear layers whose weights stay quantised in memory, and the model pass that installs them.

    QuantLinear(linear, "q4_0")        y = x @ W^T + b with W packed at construction (formats.py) and
                                       multiplied by kernels.matmul for any number of rows
    QuantEmbedding(head)               token lookups served from a tied head's packed weight
    quantize_model(model, "q4_0")      every nn.Linear replaced in place -> report

quantize_model replaces the layer types it knows compute y = x W^T + b (QUANTIZABLE, exact types): a subclass of
nn.Linear may compute something else, which a QuantLinear would silently drop, so it stays as it is and the report
names it under "refused".

The output head gets `head_format(fmt)`: Q8_0 for the 4-bit formats (as llama.cpp's own Q4
files keep it; the head and its tied embedding are the most quantisation-sensitive matrix),
`fmt` otherwise. A tied head (GPT-2's lm_head = wte, SmolLM's lm_head = embed_tokens) is
quantised once and the embedding then looks its rows up in those packed weights, so the float
copy is dropped instead of kept beside the quantised one (llama.cpp does the same).
Packed tensors are registered buffers, so `model.buffers()` (and weight_arena.place_weights)
see them; outputs have the input's dtype (the kernels compute in float32).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import FORMATS, Packed, dequantize, quantize

HEAD_NAMES = ("lm_head",)
QUANTIZABLE = (nn.Linear,)  # exact types whose forward is x W^T + b


def head_format(fmt: str) -> str:
    return "q8_0" if fmt.startswith("q4") else fmt


class _PackedModule(nn.Module):
    def _register_packed(self, p: Packed) -> None:
        self.fmt, self.in_features = p.fmt, p.in_features
        self.register_buffer("qs", p.qs)
        self.register_buffer("d", p.d)
        self.register_buffer("m", p.m)

    @property
    def packed(self) -> Packed:  # built on demand: place_weights may have moved the buffers
        return Packed(self.fmt, self.in_features, self.qs, self.d, self.m)


class QuantLinear(_PackedModule):
    def __init__(self, linear: nn.Linear, fmt: str):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")
        self._register_packed(quantize(linear.weight, fmt))
        self.out_features = linear.out_features
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    @classmethod
    def concat(cls, layers: list[QuantLinear]) -> QuantLinear:
        """One layer whose output is `layers`' outputs side by side (model/fused_linear.py): their packed rows
        stacked, nothing re-quantised (every format's blocks belong to one row)."""
        first = layers[0]
        if len({(m.fmt, m.in_features, m.bias is None) for m in layers}) != 1:
            raise ValueError("only layers of one format, input size and bias use can be concatenated")
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        parts = [m.packed for m in layers]
        fused._register_packed(Packed(first.fmt, first.in_features, *(
            None if getattr(first.packed, f) is None else torch.cat([getattr(p, f) for p in parts])
            for f in ("qs", "d", "m"))))
        fused.out_features = sum(m.out_features for m in layers)
        fused.bias = None if first.bias is None else nn.Parameter(torch.cat([m.bias for m in layers]),
                                                                  requires_grad=False)
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        y = kernels.matmul(rows if rows.dtype == torch.float32 else rows.float(), self.packed, self.bias)
        y = y.view(*lead, self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)  # no dispatch at all for float32 (a decode step has 120)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt}"


class QuantEmbedding(nn.Module):
    """nn.Embedding whose table is a QuantLinear's packed weight (the tied head's)."""

    def __init__(self, head: QuantLinear, dtype: torch.dtype):
        super().__init__()
        self.head, self.dtype = [head], dtype  # a list: the head is registered once, under its own name
        self.embedding_dim = head.in_features

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        p = self.head[0].packed
        flat = idx.reshape(-1)
        rows = Packed(p.fmt, p.in_features, p.qs[flat], None if p.d is None else p.d[flat],
                      None if p.m is None else p.m[flat])
        return dequantize(rows, self.dtype).view(*idx.shape, self.embedding_dim)


def _weight_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def quantize_model(model: nn.Module, fmt: str) -> dict[str, Any]:
    """Replace every nn.Linear of `model` in place by a QuantLinear in `fmt` (the head in head_format(fmt)).

    Returns {"format", "layers", "bytes_before", "bytes_after", "refused"}: the linear weights' bytes (plus a tied
    embedding's, which the packed head replaces), and {module name: reason} for linear layers left in float."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")
    embeddings = {id(m.weight): (parent, name, m) for parent in model.modules()
                  for name, m in parent.named_children() if isinstance(m, nn.Embedding)}
    before = after = layers = 0
    refused: dict[str, str] = {}
    names = {id(m): n for n, m in model.named_modules()}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if type(child) not in QUANTIZABLE:
                refused[names[id(child)]] = f"{type(child).__name__} is not one of the layer types it quantises"
                continue
            q = QuantLinear(child, head_format(fmt) if name in HEAD_NAMES else fmt)
            setattr(parent, name, q)
            layers += 1
            before += _weight_bytes(child.weight)
            after += q.packed.nbytes
            tied = embeddings.get(id(child.weight))
            if tied is not None:  # lookups from the packed head; the float table goes
                eparent, ename, emb = tied
                setattr(eparent, ename, QuantEmbedding(q, emb.weight.dtype))
    return {"format": fmt, "layers": layers, "bytes_before": before, "bytes_after": after, "refused": refused}
