"""The Llama block's elementwise steps as single C++ passes with hand-written backwards, for bf16 training on CPU.

    active(x)                      True under CPU bf16 autocast when the extension is built (model/llama.py
                                   then takes these paths; otherwise its plain PyTorch ops)
    rms_norm(x, w, eps)            x f32 [..., H] -> bf16 (x / rms(x)) * w       (RMSNorm in float32, as HF)
    rope_split(qkv, cos, sin, hq, hk)
                                   qkv bf16 [B, T, hq + 2 hk, D] -> q, k, v float32 [B, heads, T, D]: q and k
                                   rotated (model/llama.rotary_table's signed sin), in attention's layout
    swiglu(gu)                     gu bf16 [..., 2 I] = [gate | up] -> bf16 silu(gate) * up
    residual_add(x, y)             x float32 + y bf16 -> float32: the residual stream plus a branch's bf16 output
    loss_rows_serve(t)             whether extension().logsumexp_rows / cross_entropy_grad (the training loss's
                                   rows: train/cross_entropy.py, train/frozen_head.py) take t: CPU, bf16 or float32

Why: under autocast the matmuls are bf16 but each step between them was several PyTorch ops, each a pass
over a whole activation in float32 (RMSNorm's backward alone is six). Each function here is one pass
forward and one backward (fused_ops.cpp), computing in float32 and rounding once where the plain path
rounds, so gradients match the plain path's to bf16 rounding (tests/kernels/test_fused_ops.py holds both against
float64). The outputs are what the next op would cast to anyway: bf16 for the matmuls after the norm and
SwiGLU, float32 for the float32 attention (model/attention.py). The passes are Llama's (model/llama.py calls
them, under the conditions it knows); this module is only their C++ and their backwards.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from tinystack.kernels.build import build

_HERE = Path(__file__).parent
_SOURCES = [_HERE / "fused_ops.cpp", _HERE / "fused_attention.cpp", _HERE / "cross_entropy_rows.cpp"]


@functools.lru_cache(maxsize=1)
def extension():
    """The compiled kernels, or None (one warning) where no C++ compiler can build them."""
    return build("tinystack_fused_ops", _SOURCES, [_HERE / "fused_ops.h"],
                 cflags=["-O3", "-fno-trapping-math", "-fopenmp"], ldflags=["-fopenmp"], ops="tinystack_train")


def active(x: torch.Tensor) -> bool:
    """Whether the fused ops serve this forward: CPU, bf16 autocast on, the extension built, and not a model being
    traced by torch.compile (`[train] compile`: the tracer runs ops on fake tensors, which these C++ operators do
    not take; the compiled model runs the plain PyTorch ops, which the compiler fuses itself)."""
    return (x.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not torch.compiler.is_compiling()
            and extension() is not None)


def loss_rows_serve(t: torch.Tensor) -> bool:
    """Whether the C++ loss rows (logsumexp_rows, cross_entropy_grad) take logits like t: a CPU tensor in bf16 or
    float32, the extension built; otherwise the caller's torch blocks compute the same."""
    return t.device.type == "cpu" and t.dtype in (torch.bfloat16, torch.float32) and extension() is not None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, rstd = extension().rms_norm_fwd(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, rstd = ctx.saved_tensors
        gx, gw = extension().rms_norm_bwd(gy, x, w, rstd, ctx.needs_input_grad[1])
        return gx, (gw if ctx.needs_input_grad[1] else None), None


class _RopeSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head, n_kv_head):
        ctx.save_for_backward(cos, sin)
        return tuple(extension().rope_split_fwd(qkv, cos, sin, n_head, n_kv_head))

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors  # an unused output's gradient arrives as zeros (materialize_grads)
        return extension().rope_split_bwd(dq, dk, dv, cos, sin), None, None, None, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        return extension().swiglu_fwd(gu)

    @staticmethod
    def backward(ctx, gh):
        (gu,) = ctx.saved_tensors
        return extension().swiglu_bwd(gh, gu)


class _ResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return extension().residual_add(x, y)

    @staticmethod
    def backward(ctx, g):
        return g, g.to(torch.bfloat16)  # (the bf16 branch's matmul would cast it anyway)


def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x (float32) + y (bf16) -> float32, what x + y computes, in one pass (PyTorch's mixed add writes a float32
    copy of y first); the gradient flows to x as it is and to y cast to bf16, as autograd's add would send it."""
    return _ResidualAdd.apply(x, y)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16 RMSNorm(x) * w of a float32 x [..., H] and float32 gain w [H] (gradients for both)."""
    return _RMSNorm.apply(x.float().contiguous(), w, eps)


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int,
               n_kv_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, n_head, T, D], k, v [B, n_kv_head, T, D] float32 from the fused projection's bf16 output
    qkv [B, T, n_head + 2 n_kv_head, D]; cos, sin [B, T, 1 or absent, D] float32 at each token's position."""
    B, T, _, D = qkv.shape
    return _RopeSplit.apply(qkv.to(torch.bfloat16), cos.reshape(B, T, D), sin.reshape(B, T, D), n_head, n_kv_head)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gu = [gate | up] (bf16 [..., 2 I]) -> bf16 [..., I]."""
    return _SwiGLU.apply(gu.to(torch.bfloat16))
