"""Next-token cross-entropy over a large vocabulary, computed a few rows at a time (hand-written backward).

    loss = mean over rows with a target of  logsumexp(logits[i]) - logits[i, target[i]]
    dloss/dlogits[i] = (softmax(logits[i]) - onehot(target[i])) / n_targets      (0 for ignored rows)

The contract is `F.cross_entropy(logits.float(), targets, ignore_index=...)`: the same value, in at least
float32, whatever the logits' dtype. What differs is memory traffic. For SmolLM2 (49,152 words) a batch of
4 x 256 has 50 M logits; the plain path upcasts them all to a float32 copy, writes a float32 log-softmax,
zero-fills a float32 gradient, writes the log-softmax backward and casts that back to bf16: about ten passes
over 200 MB, a large share of a LoRA step. Here each block of rows is upcast while it sits in
cache, the forward keeps only one log-sum-exp per row, and the backward recomputes the softmax of the block
and writes the gradient once, in the logits' own dtype: about three passes. Full fine-tuning and LoRA both
gain; neither needs the float32 copy of the logits. On CPU, for bf16 or float32 logits, the per-row work is one
C++ loop each way (kernels/cross_entropy_rows.cpp: `logsumexp_rows`, `cross_entropy_grad`): one read of the logits
forward, one read and one write backward; the blocks below serve the rest (float64, CUDA, no compiler).
"""
from __future__ import annotations

import torch

from tinystack.kernels import fused_ops

BLOCK_BYTES = 1 << 21  # float32 rows per block: ~2 MiB, so a block stays in L2 between its passes


def _rows_per_block(vocab: int) -> int:
    return max(1, BLOCK_BYTES // (4 * vocab))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # bf16/fp16 -> float32; float64 stays


class _BlockedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        n, vocab = logits.shape
        cdt = _compute_dtype(logits.dtype)
        valid = targets != ignore_index
        safe = torch.where(valid, targets, 0)
        if _native(logits):
            lse = fused_ops.extension().logsumexp_rows(logits)
        else:
            lse = torch.empty(n, dtype=cdt, device=logits.device)
            step = _rows_per_block(vocab)
            for i in range(0, n, step):
                lse[i:i + step] = torch.logsumexp(logits[i:i + step].to(cdt), dim=1)
        picked = logits.gather(1, safe[:, None]).squeeze(1).to(cdt)
        count = valid.sum()
        loss = ((lse - picked) * valid).sum() / count
        ctx.save_for_backward(logits, safe, valid, lse, count)
        return loss

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        logits, safe, valid, lse, count = ctx.saved_tensors
        n, vocab = logits.shape
        cdt = lse.dtype
        scale = (g.to(cdt) / count) * valid  # per row: 0 where the target is ignored
        if _native(logits):
            return fused_ops.extension().cross_entropy_grad(logits, safe, lse, scale, False), None, None
        grad = torch.empty_like(logits)
        step = _rows_per_block(vocab)
        rows = torch.arange(n, device=logits.device)
        for i in range(0, n, step):
            j = min(i + step, n)
            p = (logits[i:j].to(cdt) - lse[i:j, None]).exp_()  # the block's softmax (a new tensor, never logits)
            p[rows[: j - i], safe[i:j]] -= 1.0
            grad[i:j] = p.mul_(scale[i:j, None])
        return grad, None, None


def _native(logits: torch.Tensor) -> bool:
    return fused_ops.loss_rows_serve(logits)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy of logits [N, V] against targets [N] (rows with `ignore_index` skipped; NaN when
    every row is), in float32 or better; equal to F.cross_entropy on the upcast logits."""
    return _BlockedCrossEntropy.apply(logits, targets, ignore_index)
