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
    extract_adapter(model)                     the adapters unmerged, as a LoRAAdapter (PEFT's layout
                                               on disk: model/lora_adapter.py), for serving beside the base

Fused projections (model/fused_linear.py: q/k/v -> qkv_proj, gate/up -> gate_up_proj, which the trainer applies
before injecting) keep one adapter per original projection: A stacks the parts' A matrices [P r, in] and the
update uses B block-diagonally, so the model, its merged weights and its parameter count are those of
separate adapters, but the P adapters sharing an input run as one.

Why the product is written by hand (`_LoRAProduct`): per adapter, the plain graph is ~8 thin matmuls and adds
(x @ A.T is [N, r]) each a full pass over an [N, in] or [N, out] activation. With 210 adapters on SmolLM2 they
cost LoRA a large share of its step. Here a group of adapters sharing an input is a handful of products:

    xa = x A^T;  y = x W^T;  y += xa (s B)^T                    one thin product and one rank-P r update, in place
    g_xa = g (s B);  grad_x = g W, += g_xa A;  grad_A = g_xa^T x;  grad_B = the diagonal blocks of g^T xa

On CPU each direction is one C++ call: on CPUs with AMX, in bf16, where it measures faster for the shape
(kernels/lora_amx.py), all of them fused in one pass over each activation; otherwise linear_ops.cpp's library products
(the large one, x W^T or g W, spread over the threads as kernels/matmul_plan.py planned it); without a compiler, or
traced by torch.compile, the same products from Python. B's gradient is the whole g^T xa [out, P r] of which each
part keeps its diagonal block (its rows of B only meet its own output rows). W and s B are separate, contiguous
tensors (docs/train.md: a shared buffer made oneDNN repack W every call). With dropout, or an unfrozen base, the
layer uses the plain autograd path (same forward).

The frozen weight is held in the compute dtype (bf16 under autocast: QLoRA's observation, a base that is never
updated need not be re-cast from its float32 master every step), cast once and again only when the master changes
(in-place write, load_state_dict, .to()); in the master's own dtype (float32 training) it is the master itself;
s B (and the fused product's packed A and s B) is made anew when B or A changes (once per optimiser step). The
float32 master stays the weight: `merged()` and the saved model use it, never the copy (not a buffer: never saved).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tinystack.config import FinetuneConfig
from tinystack.kernels import lora_amx
from tinystack.kernels.matmul_plan import linear_ops, row_parts
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.train.kept_cast import compute_dtype, kept_cast

# [finetune] lora_targets: the attention and MLP projections of both families (GPT-2: c_attn, c_proj,
# c_fc; Llama: the rest); the output head and the embeddings stay frozen (tied in most small models).
DEFAULT_TARGETS = tuple(FinetuneConfig().lora_targets)


class _Parts:
    """Where each adapter of a (possibly fused) layer lives: rows of the output, rows of B, columns of s B.

    spans: (first output row, rows, first row in B) per adapted part; part j uses A's rows j r .. (j + 1) r."""

    def __init__(self, sizes: Sequence[int], adapted: Sequence[bool], rank: int) -> None:
        self.rank, self.out = rank, sum(sizes)
        self.spans, row, b_row = [], 0, 0
        for size, on in zip(sizes, adapted):
            if on:
                self.spans.append((row, size, b_row))
                b_row += size
            row += size
        self.b_rows, self.width = b_row, rank * len(self.spans)  # B [b_rows, r]; s B spread [out, width]
        self.flat_spans = [n for row, size, _ in self.spans for n in (row, size)]  # linear_ops.cpp's form
        self.whole = len(self.spans) == 1 and self.b_rows == self.out  # one adapter on every row: no spreading

    def spread(self, b: torch.Tensor) -> torch.Tensor:
        """B [b_rows, r] -> [out, P r], part j's rows in columns j r .. (j + 1) r, zeros elsewhere (autograd-safe)."""
        if self.whole:
            return b
        full = b.new_zeros(self.out, self.width)
        r = self.rank
        for j, (row, size, b_row) in enumerate(self.spans):
            full[row:row + size, j * r:(j + 1) * r] = b[b_row:b_row + size]
        return full

    def gather(self, full: torch.Tensor) -> torch.Tensor:
        """The inverse of spread for a gradient: [out, P r] -> [b_rows, r] (each part's own block)."""
        if self.whole:
            return full
        r = self.rank
        return torch.cat([full[row:row + size, j * r:(j + 1) * r] for j, (row, size, _) in enumerate(self.spans)])


def _ops(w: torch.Tensor):
    """The product as one C++ call each way (linear_ops.cpp) for CPU tensors, or None: no compiler (one warning),
    another device, or a model being traced by torch.compile (which compiles the PyTorch calls instead: the C++
    operators have no fake-tensor rules), where the PyTorch calls below compute the same."""
    if w.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return linear_ops()


class _ComputeWeights:
    """LoRALinear's cache: the frozen weight in the compute dtype (train/kept_cast.py), a copy of B, and s B spread
    [out, P r] in the compute dtype; where the fused AMX product can run (kernels/lora_amx.py), the operands in its
    tile layout (`packed`), and then s B spread is made only if a library product asks for it (the fused product
    never does). A new cache is made each time B or A changes, so what a forward used is still there, unchanged,
    for its backward."""

    def __init__(self, weight: torch.Tensor, b: torch.Tensor, packed: lora_amx.Packed | None, parts: _Parts,
                 scale: float) -> None:
        self.weight, self.b, self.packed = weight, b, packed
        self._parts, self._scale, self._sb = parts, scale, None
        if packed is None:  # made here, outside any traced graph (torch.compile refuses a tensor cached inside)
            self._sb = self.sb

    @property
    def sb(self) -> torch.Tensor:
        if self._sb is None:
            with torch.no_grad():
                self._sb = self._parts.spread((self.b * self._scale).to(self.weight.dtype)).contiguous()
        return self._sb


class _LoRAProduct(torch.autograd.Function):
    """y = x W^T + (x A^T) (s B)^T + b for 2-D x, with W and s B from LoRALinear's cache (`cw`: frozen, contiguous,
    in the compute dtype); gradients for x, A and B only. Computed in W's dtype; y in it, the gradients in their
    inputs' dtypes."""

    @staticmethod
    def forward(ctx, x, cw, bias, lora_a, lora_b, scale, parts):
        w, dt, ops = cw.weight, cw.weight.dtype, _ops(cw.weight)
        xb, sb, ctx.packed = x.to(dt), None, None
        if ops is not None and lora_amx.takes(xb, cw.packed, lambda: cw.sb, bias, parts.flat_spans, parts.rank,
                                              scale):
            y, xa = lora_amx.forward(xb, cw.packed, bias)
            ctx.packed = cw.packed
            ctx.save_for_backward(xb, xa, lora_a, cw.packed.adapters)  # its version is checked at backward
        else:
            sb = cw.sb
            if ops is not None:
                y, xb, xa = ops.lora_fwd(xb, w, sb, bias, lora_a, row_parts(xb, w.t()))
            else:  # the same calls from Python
                xa = xb @ lora_a.to(dt).t()  # [N, P r]
                y = F.linear(xb, w, bias.to(dt) if bias is not None else None)
                y.addmm_(xa, sb.t())  # + s (x A^T) B^T
            ctx.save_for_backward(xb, xa, lora_a)
        ctx.w, ctx.sb = w, sb  # this forward's s B: a changed B gets a new tensor, never a write into this one
        ctx.scale, ctx.parts, ctx.dtypes = scale, parts, (x.dtype, lora_a.dtype, lora_b.dtype)
        return y

    @staticmethod
    def backward(ctx, g):
        x, xa, lora_a = ctx.saved_tensors[:3]
        w, sb = ctx.w, ctx.sb
        x_dtype, a_dtype, b_dtype = ctx.dtypes
        need_x = ctx.needs_input_grad[0]  # the first layer's input needs no gradient
        if ctx.packed is not None:  # the fused product (kernels/lora_amx.py)
            grad_x, grad_a, grad_b = lora_amx.backward(g.to(w.dtype), ctx.packed, x, xa, need_x,
                                                       ctx.parts.flat_spans, ctx.parts.rank, ctx.scale)
            return (None if grad_x is None else grad_x.to(x_dtype), None, None, grad_a.to(a_dtype),
                    grad_b.to(b_dtype), None, None)
        if (ops := _ops(w)) is not None:
            g = g.to(w.dtype)
            grad_x, grad_a, grad_b = ops.lora_bwd(g, w, sb, x, xa, lora_a, need_x, ctx.parts.flat_spans,
                                                  ctx.parts.rank, ctx.scale, row_parts(g, w) if need_x else 1)
            return (None if grad_x is None else grad_x.to(x_dtype), None, None, grad_a.to(a_dtype),
                    grad_b.to(b_dtype), None, None)
        g, a = g.to(w.dtype), lora_a.to(w.dtype)
        g_xa = g @ sb  # d loss / d (x A^T) [N, P r]
        grad_x = (g @ w).addmm_(g_xa, a).to(x_dtype) if need_x else None  # g W + the adapter's path
        grad_a = (g_xa.t() @ x).to(a_dtype)  # [P r, in]
        grad_b = ctx.parts.gather(g.t() @ xa).mul_(ctx.scale).to(b_dtype)  # [b_rows, r]
        return grad_x, None, None, grad_a, grad_b, None, None


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-`rank` update scaled by alpha / rank.

    `parts` (sizes, adapted): the base is a fused layer (model/fused_linear.py) whose output rows are these parts
    side by side; each adapted part gets its own rank-`rank` adapter (A [P r, in] stacked, B [adapted rows, r]).
    Default: one part, the whole layer."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 parts: tuple[Sequence[int], Sequence[bool]] | None = None) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        sizes, adapted = parts or ([base.out_features], [True])
        if sum(sizes) != base.out_features or not any(adapted):
            raise ValueError(f"LoRA parts {list(sizes)} (adapted {list(adapted)}) do not cover the layer's "
                             f"{base.out_features} output rows with at least one adapter")
        self.parts = _Parts(sizes, adapted, rank)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(self.parts.width, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.parts.b_rows, rank, device=w.device, dtype=w.dtype))
        for a in self.lora_A.split(rank):  # each part's A as nn.Linear initialises a [r, in] weight
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # two thin matmuls (x @ A.T is [.., P r]) instead of forming B @ A: r << in, out
        if isinstance(self.dropout, nn.Dropout) or self.base.weight.requires_grad:
            update = self.dropout(x) @ self.lora_A.t() @ self.parts.spread(self.lora_B).t()
            return self.base(x) + update * self.scale
        device = x.device.type
        dtype = compute_dtype(self.base.weight, device)
        with torch.autocast(device, enabled=False):  # the product casts for itself (to the copy's dtype)
            y = _LoRAProduct.apply(x.reshape(-1, x.shape[-1]), self._compute_weights(dtype), self.base.bias,
                                   self.lora_A, self.lora_B, self.scale, self.parts)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _compute_weights(self, dtype: torch.dtype) -> _ComputeWeights:
        """W and s B spread in `dtype`: the frozen weight cast once (kept_cast: again only when the master changes;
        the master itself when it is in `dtype`), s B made anew when W's copy or B changed (B compared by value: it
        is [rows, r], and the fused AdamW step writes it without bumping its version counter)."""
        w, b, a = kept_cast(self.base.weight, dtype), self.lora_B, self.lora_A
        cw = getattr(self, "_weight_copy", None)
        if (cw is None or cw.weight is not w or not torch.equal(cw.b, b)
                or (cw.packed is not None and not torch.equal(cw.packed.a, a))):
            old = cw.packed if cw is not None else None
            with torch.no_grad():  # two sets of packed buffers in turn: the one before last is written over
                fused = lora_amx.prepare(w, a, b, self.scale, self.parts.flat_spans, self.rank, old,
                                         getattr(self, "_spare", None))
                b_copy, packed = fused if fused is not None else (b.detach().clone(), None)
            self._spare = old
            self._weight_copy = cw = _ComputeWeights(w, b_copy, packed, self.parts, self.scale)
        return cw

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing what this layer computes (dropout off), in the base weight's dtype."""
        base = self.base
        out = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                        device=base.weight.device, dtype=base.weight.dtype)
        b = self.parts.spread(self.lora_B.double())  # float64: one rounding, at the end
        delta = (b @ self.lora_A.double()) * self.scale
        out.weight.copy_((base.weight.double() + delta).to(base.weight.dtype))
        if base.bias is not None:
            out.bias.copy_(base.bias)
        return out


def _matches(name: str, targets: Sequence[str]) -> bool:
    return name.rsplit(".", 1)[-1] in targets


def inject_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS,
                dropout: float = 0.0) -> list[str]:
    """Freeze every parameter of `model`, then wrap each targeted nn.Linear in a LoRALinear (in place). A fused
    layer (qkv_proj, ...) is targeted by its original names: one adapter for each of them that is a target. A
    target may name several layers separated by commas ("q_proj,v_proj", as typed on a command line).

    Returns the wrapped module names; raises ValueError, naming the layers there are, when no layer matches."""
    targets = [t.strip() for entry in targets for t in entry.split(",") if t.strip()]
    for p in model.parameters():
        p.requires_grad_(False)
    wrap: dict[str, tuple[list[int], list[bool]] | None] = {}
    names: set[str] = set()  # what a target can name: each linear layer, a fused one by its original parts
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear):
            continue
        parent_name, _, child = name.rpartition(".")
        fused = getattr(model.get_submodule(parent_name) if parent_name else model, "fused_parts", {}).get(child)
        if fused is not None:
            names.update(fused[0])
            adapted = [_matches(n, targets) for n in fused[0]]
            if any(adapted):
                wrap[name] = (fused[1], adapted)
        else:
            names.add(child or name)
            if _matches(name, targets):
                wrap[name] = None
    if not wrap:
        raise ValueError(f"no linear layer matches LoRA targets {targets} (this model has: {sorted(names)})")
    for name, parts in wrap.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, dropout, parts))
    return list(wrap)


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear by its merged nn.Linear (in place); returns `model`."""
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, getattr(parent, child).merged())
    return model


def extract_adapter(model: nn.Module) -> LoRAAdapter:
    """The model's LoRALinear adapters as one LoRAAdapter (PEFT's module names: a fused layer's parts under the
    names of the projections they were), unmerged: what the server loads beside the base (infer/lora.py)."""
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    rank, scale = 0, 1.0
    for name, m in model.named_modules():
        if not isinstance(m, LoRALinear):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        names = list(getattr(parent, "fused_parts", {}).get(child, ([child], []))[0])
        offsets = list(itertools.accumulate([0, *getattr(parent, "fused_parts", {}).get(child, ([], []))[1]]))
        a, b, r = m.lora_A.detach().float(), m.lora_B.detach().float(), m.rank
        for j, (row, size, b_row) in enumerate(m.parts.spans):
            part = names[offsets.index(row)] if len(names) > 1 else child
            path = f"{parent_name}.{part}" if parent_name else part
            weights[path] = (a[j * r:(j + 1) * r].clone(), b[b_row:b_row + size].clone())
        rank, scale = r, m.scale
    if not weights:
        raise ValueError("the model has no LoRA adapters to extract")
    return LoRAAdapter(weights, rank, scale)


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapter matrices (A and B of every LoRALinear)."""
    return [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]
