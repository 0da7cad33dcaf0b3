"""The training loss: next-token cross-entropy over the positions that have a target.

    next_token_loss(model, x, y)      the forward and the loss: a trained head through its logits (target_logits,
                                      lm_loss), a frozen one without them (train.frozen_head)
    lm_loss(logits, targets)          mean cross-entropy, IGNORE_INDEX targets skipped (train.cross_entropy)
    trim_targets(x, y)                trailing columns without any target cut (padding)

One loss, one ignore index: IGNORE_INDEX (-100, PyTorch's and Hugging Face's) comes from nn.loss, and lm_loss
is the mean of eval.scoring.token_nll (the per-token loss every score is summed from), computed by the fused
rows for speed. Validation and held-out losses are scores: eval.scoring.score_batches.
"""
from __future__ import annotations

import torch

from tinystack.eval.scoring import IGNORE_INDEX, target_logits
from tinystack.train.cross_entropy import cross_entropy
from tinystack.train.frozen_head import frozen_head_loss

__all__ = ["IGNORE_INDEX", "lm_loss", "next_token_loss", "target_logits", "trim_targets"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in the logits' precision, at least float32 (bf16/fp16 are upcast a block
    of rows at a time: train.cross_entropy, F.cross_entropy's value without a float32 copy of the logits)."""
    return cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), IGNORE_INDEX)


def next_token_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `model` on x -> y (IGNORE_INDEX targets skipped), under whatever autocast
    the caller set. When the output head's weight takes no gradient (frozen: LoRA; or no grad mode: evaluation)
    the loss applies the head itself a block of rows at a time (train.frozen_head): the same loss and gradients
    without the [positions, vocab] logits; a trained head goes through them (target_logits, lm_loss). Only
    positions with a target reach the head either way."""
    head = getattr(model, "module", model).lm_head  # DDP wraps the model; its forward still runs (gradient sync)
    if head.bias is not None or (head.weight.requires_grad and torch.is_grad_enabled()):
        return lm_loss(*target_logits(model, x, y))
    keep = y != IGNORE_INDEX
    every = bool(keep.all())
    h = model(x, logit_index=None if every else keep, apply_head=False)[0]
    return frozen_head_loss(h.reshape(-1, h.size(-1)), head.weight, (y if every else y[keep]).reshape(-1),
                            IGNORE_INDEX)


def trim_targets(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut the trailing columns where no row has a target (padding): under a causal mask they change
    nothing before them, so the loss is the same and the step cheaper. Token batches keep every column."""
    has = (y != IGNORE_INDEX).any(dim=0)
    last = int(has.nonzero().max()) + 1 if bool(has.any()) else y.size(1)
    return (x[:, :last], y[:, :last]) if last < y.size(1) else (x, y)
