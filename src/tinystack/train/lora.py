"""LoRA: low-rank adapters on a frozen model's linear projections (Hu et al., 2021), hand-built.

    y = base(x) + (alpha / r) * (dropout(x) @ A.T) @ B.T        A [r, in], B [out, r]

A starts Kaiming-uniform (as `nn.Linear` initialises its weight), B starts at zero, so an
injected model computes exactly what the base model computes until B has been trained.
Only A and B train; every other parameter of the model is frozen by `inject_lora`, so
the optimiser holds (and AdamW keeps state for) r * (in + out) numbers per adapted layer
instead of in * out.

    inject_lora(model, rank, alpha, targets)   each nn.Linear whose name ends in a target
                                               (q_proj, c_attn, ...) -> LoRALinear; rest frozen
    merge_lora(model)                          each LoRALinear -> a plain nn.Linear with
                                               W + (alpha / r) * B @ A: the model directory
                                               written afterwards is an ordinary one

The backward is written by hand (`_LoRAProduct`): autograd's own graph for the same forward
adds the two gradients of x in a separate pass and picks slow layouts for the thin products
(g @ B ran ~3x slower than (B^T @ g^T)^T on this CPU), which cost LoRA a fifth of its step
time on SmolLM2 with adapters on all seven projections. With dropout the layer uses the plain
autograd path (same forward).

Under autocast (bf16 training, `[train] dtype` bfloat16 or `auto` resolving to it) the same hand-written
product runs in the autocast dtype, as autocast itself would run the base GEMM, and the frozen weight is
used from a low-precision copy made once (QLoRA's observation: a base that is never updated need not be
re-cast from its float32 master every step). Autocast caches casts only for leaves that require grad,
so without the copy every forward re-cast all frozen projection weights, and the adapter's extra matmuls,
scaling and add each went through autocast separately: LoRA ran at 1.16x full fine-tuning's tokens/s in
bf16 on a Xeon with AMX (1.39x in float32; one run each, one thread, under load). The float32 master
stays the weight: `merged()` and the saved model use it, never the copy.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tinystack.config import FinetuneConfig

# [finetune] lora_targets: the attention and MLP projections of both families (GPT-2: c_attn, c_proj,
# c_fc; Llama: the rest); the output head and the embeddings stay frozen (tied in most small models).
DEFAULT_TARGETS = tuple(FinetuneConfig().lora_targets)


class _LoRAProduct(torch.autograd.Function):
    """y = x W^T + b + (x A^T)(s B)^T for 2-D x, with W, b frozen; gradients for x, A and B only.

    Computed in W's dtype (x, A, B and b cast to it; no-ops in float32); y comes out in that dtype, the
    gradients in their inputs' dtypes (float32 masters for A and B, whatever x was)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scale):
        dt = weight.dtype
        xc, a = x.to(dt), lora_a.to(dt)
        xa = F.linear(xc, a)  # [N, r]
        b_scaled = (lora_b * scale).to(dt)  # [out, r]: scaling the thin factor, not the [N, out] product
        bias = bias.to(dt) if bias is not None else None
        y = F.linear(xc, weight, bias).addmm_(xa, b_scaled.t())  # the adapter added inside the GEMM, in place
        ctx.save_for_backward(xc, weight, a, b_scaled, xa)
        ctx.scale, ctx.dtypes = scale, (x.dtype, lora_a.dtype, lora_b.dtype)
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, lora_a, b_scaled, xa = ctx.saved_tensors
        x_dtype, a_dtype, b_dtype = ctx.dtypes
        g = g.to(weight.dtype)
        g_xa = (b_scaled.t() @ g.t()).t()  # [N, r]
        grad_b = ((xa.t() @ g).t() * ctx.scale).to(b_dtype)  # [out, r]
        grad_a = (g_xa.t() @ x).to(a_dtype)  # [r, in]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ weight).addmm_(g_xa, lora_a).to(x_dtype)  # both paths, one pass
        return grad_x, None, None, grad_a, grad_b, None


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-`rank` update scaled by alpha / rank."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's own init, as in the reference code
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # two thin matmuls (x @ A.T is [.., r]) instead of forming B @ A: r << in, out
        if isinstance(self.dropout, nn.Dropout) or self.base.weight.requires_grad:
            return self.base(x) + (self.dropout(x) @ self.lora_A.t() @ self.lora_B.t()) * self.scale
        weight = self.base.weight
        device = x.device.type
        if torch.is_autocast_enabled(device) and weight.is_floating_point():
            weight = self._frozen_weight(torch.get_autocast_dtype(device))
        with torch.autocast(device, enabled=False):  # the product casts for itself (to the weight's dtype)
            y = _LoRAProduct.apply(x.reshape(-1, x.shape[-1]), weight, self.base.bias, self.lora_A,
                                   self.lora_B, self.scale)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _frozen_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The frozen base weight in `dtype`: cast once and kept (not a buffer: never saved) until the
        master weight changes (in-place write, load_state_dict, .to())."""
        w = self.base.weight
        if w.dtype == dtype:
            return w
        key = (dtype, w.data_ptr(), w._version)
        cache = getattr(self, "_weight_copy", None)
        if cache is None or cache[0] != key:
            self._weight_copy = cache = (key, w.detach().to(dtype))
        return cache[1]

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing what this layer computes (dropout off), in the base weight's dtype."""
        base = self.base
        out = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                        device=base.weight.device, dtype=base.weight.dtype)
        delta = (self.lora_B.double() @ self.lora_A.double()) * self.scale  # float64: one rounding, at the end
        out.weight.copy_((base.weight.double() + delta).to(base.weight.dtype))
        if base.bias is not None:
            out.bias.copy_(base.bias)
        return out


def _matches(name: str, targets: Sequence[str]) -> bool:
    return name.rsplit(".", 1)[-1] in targets


def inject_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS,
                dropout: float = 0.0) -> list[str]:
    """Freeze every parameter of `model`, then wrap each targeted nn.Linear in a LoRALinear (in place).

    Returns the wrapped module names; raises ValueError when no layer matches `targets`."""
    for p in model.parameters():
        p.requires_grad_(False)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, targets)]
    if not names:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"no linear layer matches LoRA targets {list(targets)} (this model has: {linear})")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, dropout))
    return names


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear by its merged nn.Linear (in place); returns `model`."""
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, getattr(parent, child).merged())
    return model


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapter matrices (A and B of every LoRALinear)."""
    return [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]
