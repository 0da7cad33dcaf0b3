"""Per-document scoring: every record's own loss, so metrics can be sliced by source and length.

Each document is scored the way the token files present it to the model: it follows
an end-of-text separator and ends with one, so the targets are its tokens plus the
closing separator (and its bytes are its UTF-8 bytes plus one for the separator,
the convention of `tinystack.tokenizer.shards`). A document longer than the context
is cut into consecutive non-overlapping windows of block_size targets, each window
seeing only its own tokens (the same fixed-window rule as `metrics.evaluate_tokens`).

Windows of all documents are batched together, longest first (so padding is small),
and the per-token sums are added back to their document: the order of batches does
not change any result, and the per-document sums add up exactly to the totals.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tinystack.eval.metrics import context_len
from tinystack.model.gpt import GPT
from tinystack.progress import progress_bar

IGNORE = -100  # cross_entropy's ignore_index: padded target positions


@dataclass
class DocScores:
    """Per-document sums (one entry per scored document, in input order)."""

    nats: np.ndarray  # float64: summed next-token negative log-likelihood
    tokens: np.ndarray  # int64: scored targets (document tokens + the closing separator)
    bytes: np.ndarray  # int64: UTF-8 bytes + 1 for the separator
    correct: np.ndarray  # int64: targets the argmax predicted

    def __len__(self) -> int:
        return len(self.nats)

    @property
    def loss(self) -> np.ndarray:
        """Mean nats per token of each document."""
        return self.nats / np.maximum(self.tokens, 1)


def document_ids(tokenizer, text: str) -> list[int]:
    """separator + the text's tokens + separator: the context and targets of one document."""
    eos = tokenizer.eos_token_id
    return [eos, *tokenizer.encode_ordinary(text), eos]


def _windows(ids_per_doc: Sequence[Sequence[int]], block_size: int) -> list[tuple[int, list[int]]]:
    out = []
    for d, ids in enumerate(ids_per_doc):
        for s in range(0, len(ids) - 1, block_size):
            out.append((d, list(ids[s:s + block_size + 1])))
    return out


@torch.no_grad()
def score_documents(model: GPT, ids_per_doc: Sequence[Sequence[int]], nbytes: Sequence[int], *,
                    batch_size: int = 16, device: str = "cpu", progress: bool = False,
                    label: str = "eval") -> DocScores:
    """Score documents given as `document_ids` lists; `nbytes[i]` is document i's byte count."""
    model.eval()
    n = len(ids_per_doc)
    nats, tokens, correct = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    wins = sorted(_windows(ids_per_doc, context_len(model)), key=lambda w: -len(w[1]))
    with progress_bar(label, len(wins), progress) as advance:
        for b in range(0, len(wins), batch_size):
            batch = wins[b:b + batch_size]
            width = len(batch[0][1]) - 1  # longest first: the first window is the widest
            x = torch.zeros((len(batch), width), dtype=torch.long)
            y = torch.full((len(batch), width), IGNORE, dtype=torch.long)
            for i, (_, w) in enumerate(batch):
                x[i, :len(w) - 1] = torch.tensor(w[:-1])
                y[i, :len(w) - 1] = torch.tensor(w[1:])
            x, y = x.to(device), y.to(device)
            logits, _ = model(x)
            nll = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=IGNORE, reduction="none")
            hit = (logits.argmax(dim=-1) == y) & (y != IGNORE)
            doc = np.array([d for d, _ in batch])
            np.add.at(nats, doc, nll.sum(dim=1).double().cpu().numpy())
            np.add.at(tokens, doc, (y != IGNORE).sum(dim=1).cpu().numpy())
            np.add.at(correct, doc, hit.sum(dim=1).cpu().numpy())
            advance(len(batch))
    return DocScores(nats, tokens, np.asarray(nbytes, dtype=np.int64), correct)


@torch.no_grad()
def target_nats(model: GPT, context: Sequence[int], target: Sequence[int], device: str = "cpu") -> np.ndarray:
    """Per-token negative log-likelihood of `target` following `context` (context cut from the left to fit)."""
    if not target:
        raise ValueError("empty target")
    T = context_len(model)
    if len(target) > T:
        raise ValueError(f"target is {len(target)} tokens; the model's context is {T}")
    seq = [*context, *target][-(T + 1):]
    x = torch.tensor([seq[:-1]], device=device)
    y = torch.tensor(seq[1:], device=device)
    logits, _ = model(x)
    nll = F.cross_entropy(logits[0].float(), y, reduction="none")
    return nll[-len(target):].double().cpu().numpy()
