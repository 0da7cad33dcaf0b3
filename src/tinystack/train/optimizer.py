"""AdamW for the training loops (loop.train_model; numpy_loop mirrors its decay rule)."""
from __future__ import annotations

import torch

from tinystack.config import TrainConfig

_NO_DECAY = ("wte", "wpe", "embed_tokens")  # embeddings: GPT-2's, Llama's


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, decoupled decay on 2-D Linear weights only (an embedding
    tied to the head is listed once, undecayed); frozen parameters get no optimiser state.

    The fused kernel (one pass over all parameters; on CPU since torch 2.4) where the device has it:
    without it, CPU AdamW falls back to a Python loop of ~7 small ops per tensor."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and not any(n in name for n in _NO_DECAY) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    device = next(model.parameters()).device.type
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             fused=device in ("cpu", "cuda"))
