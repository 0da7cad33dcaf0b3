"""token_nll: the per-position next-token negative log-likelihood every score and perplexity is summed from.

It lives here, in the nn layer (below both), because its callers sit on two layers: evaluation
(eval.scoring: score_batches, score_documents, target_nats, and through them validation and the gates) and
inference (infer.quant.auto: the perplexity a weight format is judged by). Training's step loss
(train.loss.lm_loss) is its mean, computed by fused rows for speed (tested equal).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tinystack.nn.loss import IGNORE_INDEX

BLOCK_BYTES = 1 << 21  # float32 logits upcast per block of rows: ~2 MiB, the rest stays in the model's dtype


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token negative log-likelihood (nats) of logits [..., V] at targets [...], 0 where a target is
    IGNORE_INDEX; float32 or better whatever the logits' dtype (upcast a block of rows at a time, no float32
    copy of all logits): F.cross_entropy(..., ignore_index=-100, reduction="none")."""
    vocab = logits.size(-1)
    flat, t = logits.reshape(-1, vocab), targets.reshape(-1)
    cdt = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(t.shape, dtype=cdt, device=logits.device)
    step = max(1, BLOCK_BYTES // (4 * vocab))
    for i in range(0, len(t), step):
        out[i:i + step] = F.cross_entropy(flat[i:i + step].to(cdt), t[i:i + step], ignore_index=IGNORE_INDEX,
                                          reduction="none")
    return out.view(targets.shape)
