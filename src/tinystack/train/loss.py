"""The training loss: next-token cross-entropy over the positions that have a target.

    next_token_loss(model, x, y)      the forward and the loss: a trained head through its logits (target_logits,
                                      lm_loss), a frozen one without them (train.frozen_head)
    lm_loss(logits, targets)          mean cross-entropy, IGNORE_INDEX targets skipped (train.cross_entropy)
    target_logits(model, x, y)        the forward, the head only where a target is (a chat's prompt has none)
    trim_targets(x, y)                trailing columns without any target cut (padding)
    batches_loss(model, batches, ..)  mean loss per target token over fixed batches (validation, evaluation)
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tinystack.config import TrainConfig
from tinystack.model.gpt import GPT
from tinystack.train import precision
from tinystack.train.batches import eval_batches
from tinystack.train.cross_entropy import cross_entropy
from tinystack.train.frozen_head import frozen_head_loss

IGNORE_INDEX = -1  # a target the loss skips (padding, prompt tokens); the models' own ignore_index


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in the logits' precision, at least float32 (bf16/fp16 are upcast a block
    of rows at a time: train.cross_entropy, F.cross_entropy's value without a float32 copy of the logits)."""
    return cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), IGNORE_INDEX)


def target_logits(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, their targets): the head (the largest matmul, and the softmax over the vocabulary after it) runs
    only at positions with a target when some have none (a chat's prompt tokens), through the models'
    `logit_index` mask; every position otherwise (pretraining)."""
    keep = y != IGNORE_INDEX
    if bool(keep.all()):
        return model(x)[0], y
    return model(x, logit_index=keep)[0], y[keep]


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


@torch.no_grad()
def batches_loss(model: torch.nn.Module, batches: Sequence[tuple[np.ndarray, np.ndarray]], dtype: str,
                 device: torch.device | str) -> tuple[float, int]:
    """(mean loss per target token over all batches, number of target tokens); IGNORE_INDEX targets skipped."""
    was_training = model.training
    model.eval()
    dev = torch.device(device)
    total, count = 0.0, 0
    for xb, yb in batches:
        x, y = trim_targets(torch.from_numpy(xb).to(dev), torch.from_numpy(yb).to(dev))
        with precision.autocast(dtype, dev.type):
            loss = next_token_loss(model, x, y)
        n = int((y != IGNORE_INDEX).sum())
        total += loss.item() * n
        count += n
    model.train(was_training)
    return (total / count if count else float("nan")), count


def estimate_loss(model: GPT, tokens: np.ndarray, cfg: TrainConfig, device: torch.device) -> float:
    """Mean loss over `eval_iters` fixed batches (`batches.eval_batches`), so estimates are comparable."""
    return batches_loss(model, eval_batches(tokens, cfg.batch_size, model.config.block_size, cfg.eval_iters),
                        cfg.dtype, device)[0]
