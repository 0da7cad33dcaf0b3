"""Offline metrics of a language model on a token file: loss, perplexity, bits per byte.

    loss            mean next-token cross-entropy in nats over every scored token
    perplexity      exp(loss): the effective number of equally likely choices per token
    bits_per_byte   total nats / ln 2 / bytes of text scored; unlike loss and perplexity
                    it does not depend on the tokenizer, so models with different
                    vocabularies can be compared

Scoring is deterministic: the file is cut into consecutive non-overlapping windows
of block_size + 1 tokens (each window scores block_size targets); with a cap on
windows, evenly spaced ones are taken so the estimate covers the whole split.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tinystack.model.gpt import GPT


def window_starts(n_tokens: int, block_size: int, max_windows: int = 0) -> np.ndarray:
    """Start offsets of the non-overlapping windows of block_size + 1 tokens (evenly thinned to max_windows)."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    if max_windows and len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).round().astype(int)]
    return starts


@torch.no_grad()
def evaluate_tokens(model: GPT, tokens: np.ndarray, token_nbytes: np.ndarray, *, max_windows: int = 0,
                    batch_size: int = 16, device: str = "cpu") -> dict[str, Any]:
    """Score `tokens` (a 1-D id array); `token_nbytes[id]` is each token's length in bytes."""
    model.eval()
    T = model.config.block_size
    starts = window_starts(len(tokens), T, max_windows)
    if len(starts) == 0:
        raise ValueError(f"need more than block_size={T} tokens to evaluate, got {len(tokens)}")
    total_nats, total_tokens, total_bytes = 0.0, 0, 0
    for b in range(0, len(starts), batch_size):
        win = np.stack([tokens[s:s + T + 1] for s in starts[b:b + batch_size]]).astype(np.int64)
        x = torch.from_numpy(win[:, :-1]).to(device)
        y = torch.from_numpy(win[:, 1:]).to(device)
        logits, _ = model(x)
        nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        total_nats += float(nll)
        total_tokens += y.numel()
        total_bytes += int(token_nbytes[win[:, 1:]].sum())
    loss = total_nats / total_tokens
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": total_nats / math.log(2) / total_bytes,
        "tokens": total_tokens,
        "bytes": total_bytes,
        "windows": int(len(starts)),
    }
