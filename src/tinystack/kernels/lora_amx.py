"""LoRA's product fused on CPUs with AMX (lora_amx.cpp, on amx_tiles.h): the frozen weight's product and the
adapters' thin products in one pass over each activation, in each direction.

Through library calls (linear_ops.cpp) the adapters' six thin products each read an activation from memory
again; fused, each thread runs all of them on its rows while they are in its cache, the rank update riding along
as 32 more columns of the large product's K. Used by train/lora.py's `_LoRAProduct` where it applies; elsewhere
the library calls run as before. The CPU's AMX is asked of kernels/cpu.py.

    ops()                        -> the compiled operators where this CPU runs AMX BF16 (and a compiler builds
                                    them), else None; nothing is compiled on a CPU without AMX
    prepare(w, a, b, ..., old, spare)
                                 -> (B's copy, Packed): one LoRALinear's operands for one optimiser step,
                                    Packed in AMX's tile layout (W both ways, reused from `old` when it holds the
                                    same weight copy: packed once per frozen weight; s B and A both ways, written
                                    over `spare`'s buffers when given), or None where refusal() names a reason
    refusal(w)                   -> why the fused product cannot take weight w (None: it can), from SUPPORTS
    takes(x, p, ...)             -> whether this input runs fused: rows a multiple of 32, and the fused product
                                    measured faster than the library calls for its shape (matmul_plan.fastest:
                                    timed once per shape and process, never assumed)
    forward(x, p, bias)          -> y, xa
    backward(g, p, x, xa, ...)   -> grad_x (or None), grad_A, grad_B (float32)
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from tinystack.kernels import cpu
from tinystack.kernels.build import build
from tinystack.kernels.matmul_plan import fastest, linear_ops, row_parts

CFLAGS = ["-O3", "-fopenmp", "-mamx-tile", "-mamx-bf16", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"]
ALIGN = 32  # rows and both sides of a weight: multiples of this (the kernels' 32 x 32 blocks)
# What lora_amx.cpp computes, as data: y = x W^T (+ b) + (x A^T)(s B)^T and its backward, for a frozen bf16 W on
# the CPU whose sides are multiples of ALIGN (input rows too: takes()), on a CPU with AMX BF16, run (not traced).
# The product's caller (train/lora.py) computes the same through the library calls whenever this refuses.
SUPPORTS = {"weight_dtype": torch.bfloat16, "device": "cpu", "align": ALIGN, "cpu": "AMX BF16", "traced": False}

_plans: dict[tuple, bool] = {}


@functools.lru_cache(maxsize=1)
def ops():
    if not cpu.has_amx():
        return None
    here = Path(__file__).parent
    built = build("tinystack_lora_amx", [here / "lora_amx.cpp"], headers=[here / "amx_tiles.h"],
                  cflags=CFLAGS, ldflags=["-fopenmp"], ops="tinystack_lora_amx")
    return built if built is not None and built.available() else None


class Packed:
    """One LoRALinear's operands for one optimiser step in tile layout: W^T and W (for x W^T and g W; packed once
    per frozen weight copy), and `adapters`, s B and A packed both ways (lora_amx.cpp's Layout); `a` the A they were
    made from (compared by value: the fused AdamW step writes A without bumping its version counter)."""

    def __init__(self, weight: torch.Tensor, w: tuple, adapters: torch.Tensor, copies: torch.Tensor,
                 a: torch.Tensor) -> None:
        self.weight, self.w, self.adapters, self.copies, self.a = weight, w, adapters, copies, a
        self.out, self.rows_a = weight.size(0), a.size(0)


def prepare(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, spans: list[int], rank: int,
            old: Packed | None, spare: Packed | None = None) -> tuple[torch.Tensor, Packed] | None:
    """(a copy of B, Packed) for weight copy w and adapters a, b; None where refusal(w) names a reason (not bf16,
    not CPU, sides not multiples of 32, traced by torch.compile, no AMX). `spare`: an earlier step's
    Packed of the same layer whose buffers are overwritten instead of allocated and cleared afresh (its A and B
    are then gone: a forward that used it and whose backward has not run yet fails loudly in autograd's version
    check, as the forward saves the buffer)."""
    if refusal(w) is not None:
        return None
    o = ops()
    packed_w = old.w if old is not None and old.weight is w else (o.pack(w, True), o.pack(w, False))
    reuse = (spare.adapters, spare.copies) if spare is not None else (None, None)
    adapters, copies, a_copy, b_copy = o.prepare(a, b, scale, spans, rank, w.size(0), *reuse)
    return b_copy, Packed(w, packed_w, adapters, copies, a_copy)


def refusal(w: torch.Tensor) -> str | None:
    """Why the fused product cannot take frozen weight w [out, in] (None: it can): see SUPPORTS."""
    if w.dtype != SUPPORTS["weight_dtype"]:
        return f"weight dtype {w.dtype} (the fused product takes {SUPPORTS['weight_dtype']})"
    if w.device.type != SUPPORTS["device"]:
        return f"weight on {w.device.type} (the fused product is CPU code)"
    if w.dim() != 2 or w.size(0) % ALIGN or w.size(1) % ALIGN:
        return f"weight shape {tuple(w.shape)}: both sides must be multiples of {ALIGN}"
    if torch.compiler.is_compiling():
        return "traced by torch.compile (the C++ operators take no fake tensors)"
    if not cpu.has_amx():
        return "this CPU has no AMX BF16"
    if ops() is None:
        return "the AMX extension could not be built"
    return None


def takes(x: torch.Tensor, p: Packed | None, sb: Callable[[], torch.Tensor], bias: torch.Tensor | None,
          spans: list[int], rank: int, scale: float) -> bool:
    """x: the layer's input in bf16, 2-D; sb: -> s B spread (the library path's operand, made only to measure)."""
    if p is None or x.size(0) % ALIGN or x.dtype != torch.bfloat16:
        return False
    key = (tuple(x.shape), p.out, p.rows_a, bias is not None, torch.get_num_threads())
    if key not in _plans:
        _plans[key] = _measure(x, p, sb(), bias, spans, rank, scale)
    return _plans[key]


def plans() -> dict[tuple, bool]:
    """{(x shape, out, A's rows, bias, threads): fused?} measured so far in this process."""
    return dict(_plans)


@torch.no_grad()
def _measure(x, p: Packed, sb, bias, spans, rank, scale) -> bool:
    """The library calls (linear_ops.cpp, large products planned as training plans them) against the fused
    product, each a forward and a backward on this input and a random output gradient."""
    lib, w, a = linear_ops(), p.weight, p.a.to(p.weight.dtype)
    g = torch.randn(x.size(0), p.out, dtype=x.dtype)
    xa = lib.lora_fwd(x, w, sb, bias, a, 1)[2]
    parts_f, parts_b = row_parts(x, w.t()), row_parts(g, w)

    def library() -> None:
        lib.lora_fwd(x, w, sb, bias, a, parts_f)
        lib.lora_bwd(g, w, sb, x, xa, a, True, spans, rank, scale, parts_b)

    def fused() -> None:
        _, xa_f = forward(x, p, bias)
        backward(g, p, x, xa_f, True, spans, rank, scale)
    return fastest({"library": library, "fused": fused}) == "fused"


def forward(x: torch.Tensor, p: Packed, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x W^T (+ bias) + (x A^T) (s B)^T and xa = x A^T (padded to 32 columns with zeros), both bf16."""
    return ops().fwd(x.contiguous(), p.w[0], p.adapters, bias, p.out, p.rows_a)


def backward(g: torch.Tensor, p: Packed, x: torch.Tensor, xa: torch.Tensor, need_x: bool, spans: list[int],
             rank: int, scale: float):
    """grad_x (None unless need_x; bf16), grad_A [P r, in] and grad_B [rows of B, r] (float32); xa as forward()
    returned it."""
    grad_x, grad_a, grad_b = ops().bwd(g.contiguous(), p.w[1], p.adapters, x, xa, need_x, spans, rank, scale)
    return (grad_x if need_x else None), grad_a, grad_b
