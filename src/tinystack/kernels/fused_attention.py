"""Causal attention for bf16 training on CPU: bf16 matrix products around two hand-written row passes.

    serves(q, k)              whether this path should take a training forward of these shapes: CPU bf16
                              autocast, the extension built, its saved probabilities small, and measured
                              faster than PyTorch's float32 flash attention on this machine (once per shape class)
    attention(q, k, v)        q [B, H, T, D], k, v [B, KV, T, D] (float32 or bf16; KV divides H) -> bf16 [B, H, T, D]

Why: under autocast, model/attention.py ran torch's CPU flash attention in float32 (its bf16 kernel was far slower
in the backward). Flash attention tiles the scores so they never exist whole, which on a CPU means many small
products in its own tiled loops instead of a few large ones on the machine's matmul. At training lengths
(T = 256) the whole score block of one (batch, kv head) group fits in a core's cache, so here it is made with
the matmul and kept (bf16, B H T^2 values a layer) for the backward: q k^T in float32, the causal softmax in one
pass (fused_attention.cpp), p v and the backward's four products in bf16, the softmax's backward in one pass.
Precision: the scores and the softmax in float32; p rounded to bf16 before p v (as GPU flash attention does),
and the gradients of p and of the scores in bf16, as every other activation gradient under autocast.

Which path is faster depends on the CPU (its bf16 matmul above all), so `serves` times both, forward and
backward, the first time it sees a shape class (batch, heads per kv head, head size, T rounded up to a power of
two) and keeps the answer for the process.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

from tinystack.kernels import fused_ops

MAX_SAVED_BYTES = 32 * 2**20  # the saved probabilities of one layer call (B H T^2 bf16); longer calls use flash
_TRIALS = 5  # timed rounds of each path (after one warm-up round), interleaved
_faster: dict[tuple[int, int, int, int], bool] = {}  # (B, H / KV, D, T bucket) -> this path measured faster


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        vb = v.to(torch.bfloat16)
        o, p, qb, kb = fused_ops.extension().causal_attention_fwd(q.float(), k.float(), vb, scale)
        ctx.save_for_backward(qb, kb, vb, p)
        ctx.scale, ctx.dtypes = scale, (q.dtype, k.dtype, v.dtype)
        return o

    @staticmethod
    def backward(ctx, do):
        qb, kb, vb, p = ctx.saved_tensors
        dq, dk, dv = fused_ops.extension().causal_attention_bwd(do, qb, kb, vb, p, ctx.scale)
        return tuple(g.to(dt) for g, dt in zip((dq, dk, dv), ctx.dtypes))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q [B, H, T, D] over k, v [B, KV, T, D] (grouped-query when KV < H) -> bf16 [B, H, T, D],
    with gradients for q, k and v in their own dtypes."""
    return _CausalAttention.apply(q, k, v)


def serves(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether `attention` should take this call (see the module docstring). Call it under the caller's autocast."""
    if not fused_ops.active(q) or q.dim() != 4 or q.shape[1] % k.shape[1]:
        return False
    B, H, T, D = q.shape
    if B * H * T * T * 2 > MAX_SAVED_BYTES:
        return False
    key = (B, H // k.shape[1], D, 1 << max(0, T - 1).bit_length())
    if key not in _faster:
        _faster[key] = _measure(B, H, k.shape[1], key[3], D)
    return _faster[key]


def _measure(B: int, H: int, KV: int, T: int, D: int) -> bool:
    """Time this path against float32 flash attention (what model/attention.py runs otherwise), forward and
    backward, interleaved; True when this one's median is lower."""
    gen = torch.Generator().manual_seed(0)  # the caller's random stream stays untouched
    with torch.inference_mode(False):  # (an evaluation may call from inside inference mode)
        q, k, v = (torch.randn(B, h, T, D, generator=gen).requires_grad_() for h in (H, KV, KV))
        g = torch.randn(B, H, T, D, generator=gen)

    def ours():
        attention(q, k, v).backward(g)

    def flash():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H).backward(g)

    times: dict = {ours: [], flash: []}
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        for trial in range(_TRIALS + 1):
            for fn in (ours, flash) if trial % 2 else (flash, ours):
                start = time.perf_counter()
                fn()
                if trial:  # the first round warms both up
                    times[fn].append(time.perf_counter() - start)
    return statistics.median(times[ours]) < statistics.median(times[flash])
