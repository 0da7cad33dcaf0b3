"""The training's linear layers: nn.Linear whose three products run as kernels/matmul_plan.py planned them.

    plan_linears(model)   every plain nn.Linear of `model` -> a PlannedLinear sharing its parameters (in place;
                          tied weights stay tied, state_dict names and values unchanged); returns how many
    unplan_linears(model) the reverse, once trained (finetune's evaluation and the forgetting guard's engine)
    PlannedLinear         y = x W^T + b, forward and backward through matmul_plan.mm:
                              y = x W^T,   grad_x = g W,   grad_W = g^T x,   grad_b = sum of g's rows

The products are those of F.linear under the same autocast: x and W in the compute dtype (bf16 under bf16
autocast; W cast each call when it trains, kept once when frozen: train/kept_cast.py), y and the gradients in
it, each gradient then back to its input's dtype through autograd's cast. What changes is only how each product
is spread over the threads, which matmul_plan measures per shape. The fine-tuning trainer's models use it
(train/finetune.py: build_model, for full fine-tuning and for LoRA's frozen layers alike).
"""
from __future__ import annotations

import torch
from torch import nn

from tinystack.kernels.matmul_plan import mm
from tinystack.train.kept_cast import compute_dtype, kept_cast


class _PlannedProduct(torch.autograd.Function):
    """y = x w^T (+ b) for 2-D x, all three in one dtype; gradients for whichever of them need one."""

    @staticmethod
    def forward(ctx, x, w, b):
        y = mm(x, w.t())
        if b is not None:
            y += b
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        g = g.to(w.dtype)
        grad_x = mm(g, w) if need_x else None
        grad_w = mm(g.t(), x) if need_w else None
        grad_b = g.sum(0) if need_b and ctx.has_bias else None
        return grad_x, grad_w, grad_b


class PlannedLinear(nn.Linear):
    """An nn.Linear (same parameters, same state_dict) whose products are planned per shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        dtype = compute_dtype(self.weight, device)
        # a trained weight (or bias) is cast under autograd, whose cast takes its gradient back to float32
        w = self.weight.to(dtype) if self.weight.requires_grad else kept_cast(self.weight, dtype)
        b = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(device, enabled=False):
            y = _PlannedProduct.apply(x.reshape(-1, x.shape[-1]).to(dtype), w, b)
        return y.view(*x.shape[:-1], y.shape[-1])


def plan_linears(model: nn.Module) -> int:
    """Replace every plain nn.Linear in `model` by a PlannedLinear holding the same Parameter objects."""
    return _swap(model, nn.Linear, PlannedLinear)


def unplan_linears(model: nn.Module) -> int:
    """The reverse, after training: plain nn.Linear layers again (for the inference engine and evaluation,
    whose inference-mode tensors the training products' autograd Function is not written for)."""
    return _swap(model, PlannedLinear, nn.Linear)


def _swap(model: nn.Module, old: type, new: type) -> int:
    swaps = [(name, m) for name, m in model.named_modules() if type(m) is old]
    for name, m in swaps:
        layer = new(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        layer.weight = m.weight
        layer.bias = m.bias
        layer.train(m.training)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    return len(swaps)
