"""Next-token cross-entropy through a frozen output head, a block of rows at a time, without the logits.

    loss = mean over rows with a target of  logsumexp(h[i] W^T) - (h[i] W^T)[target[i]]      h [N, C], W [V, C]
    dloss/dh[i] = (softmax(h[i] W^T) - onehot(target[i])) W / n_targets

When the head does not train (LoRA, and any model whose tied embedding is frozen) its weight needs no
gradient, so nothing after the loss needs the [N, V] logits or their gradient: only dloss/dh [N, C]. The plain
path writes all the logits (SmolLM2, 4 x 256 tokens: 50 M of them, 100 MB in bf16), reads them for the
log-sum-exp, writes a gradient as large and reads it again for the product with W, each a fresh 100 MB the
kernel must page in. Here the forward takes a block of rows at a time: their logits into one reused buffer
([rows, V], ~24 MB), their log-sum-exp and loss, the gradient of those logits written over
them (kernels/cross_entropy_rows.cpp's row loops, the same as train/cross_entropy.py's) and dloss/dh for the block
(gradient @ W): the backward is then one multiply by the incoming scalar. Same value and gradient as the head
followed by train.cross_entropy, computed in the same dtypes (the head's matmul in the compute dtype, the loss in
float32 or better).

Under autocast the head's weight is cast to the compute dtype once and kept while it is unchanged
(train/kept_cast.py), as autocast would otherwise cast its float32 master every step. Without the C++
row loops (other devices, no compiler) the blocks use PyTorch ops to the same effect.

    frozen_head_loss(h [N, C], weight [V, C], targets [N], ignore_index) -> mean loss (0-dim, float32+)
"""
from __future__ import annotations

import torch

from tinystack.kernels import fused_ops
from tinystack.train.kept_cast import compute_dtype, kept_cast

BLOCK_BYTES = 24 << 20  # logits per block (rows x V x element size), one buffer reused for every block: each
# product packs W anew, so small blocks pay that many times (2-4 MiB: slower than no blocks at all), while
# blocks past ~32 MiB fall out of cache between their passes (SmolLM2 in bf16: 256 rows a block)


def _native(h: torch.Tensor) -> bool:
    return fused_ops.loss_rows_serve(h)  # the C++ rows serve this dtype and device


class _FrozenHeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int):
        n, vocab = h.shape[0], weight.shape[0]
        cdt = torch.promote_types(h.dtype, torch.float32)
        valid = targets != ignore_index
        safe = torch.where(valid, targets, 0)
        count = valid.sum()
        scale = valid / count.clamp_min(1)  # per row: 1 / n_targets, 0 where the target is ignored
        want_grad = ctx.needs_input_grad[0]
        grad_h = torch.empty_like(h) if want_grad else None
        rows = max(1, min(n, BLOCK_BYTES // (vocab * h.element_size())))
        block = torch.empty(rows, vocab, dtype=h.dtype, device=h.device)
        total = torch.zeros((), dtype=cdt, device=h.device)
        ext = fused_ops.extension() if _native(h) else None
        for i in range(0, n, rows):
            j = min(n, i + rows)
            logits = block[: j - i]
            torch.mm(h[i:j], weight.t(), out=logits)
            lse = ext.logsumexp_rows(logits) if ext is not None else torch.logsumexp(logits.to(cdt), dim=1)
            picked = logits.gather(1, safe[i:j, None]).squeeze(1).to(cdt)
            total += ((lse.to(cdt) - picked) * valid[i:j]).sum()
            if want_grad:
                _softmax_grad_(logits, safe[i:j], lse, scale[i:j], ext)
                torch.mm(logits, weight, out=grad_h[i:j])
        ctx.save_for_backward(grad_h)
        return total / count

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (grad_h,) = ctx.saved_tensors
        # scaled in float32 (g is 1 / accumulation steps, a loss scale, ...), rounded to h's dtype once
        return (grad_h.to(g.dtype) * g).to(grad_h.dtype), None, None, None


def _softmax_grad_(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor, ext) -> None:
    """logits [R, V] <- (softmax(logits) - onehot(targets)) * scale per row, in place."""
    if ext is not None:
        ext.cross_entropy_grad(logits, targets, lse, scale, True)
        return
    cdt = lse.dtype
    p = (logits.to(cdt) - lse[:, None]).exp_()
    p[torch.arange(len(targets), device=p.device), targets] -= 1.0
    logits.copy_(p.mul_(scale[:, None].to(cdt)))


def frozen_head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of the logits h W^T [N, V] against targets [N] (rows with `ignore_index` skipped; NaN
    when every row is), without materialising the logits; gradient for h only (W must not need one). The matmul
    runs in autocast's dtype when autocast is on for h's device, else in W's; the loss in at least float32."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise ValueError("frozen_head_loss: the head's weight requires a gradient (use the logits and cross_entropy)")
    device = h.device.type
    dtype = compute_dtype(weight, device)
    with torch.autocast(device, enabled=False):
        return _FrozenHeadCrossEntropy.apply(h.to(dtype), kept_cast(weight, dtype), targets, ignore_index)
