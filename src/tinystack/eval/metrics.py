"""Offline metrics of a language model on a token file: loss, perplexity, bits per byte.

    loss            mean next-token cross-entropy in nats over every scored token
    perplexity      exp(loss): the effective number of equally likely choices per token
    bits_per_byte   total nats / ln 2 / bytes of text scored; unlike loss and perplexity
                    it does not depend on the tokenizer, so models with different
                    vocabularies can be compared
    accuracy        share of scored positions where the most likely token (argmax) is the
                    actual next token

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
from tinystack.progress import progress_bar


def context_len(model: torch.nn.Module) -> int:
    """Positions the model can see: GPT's block_size, Llama's max_position_embeddings."""
    cfg = model.config
    return int(getattr(cfg, "max_seq_len", None) or cfg.block_size)


def window_starts(n_tokens: int, block_size: int, max_windows: int = 0) -> np.ndarray:
    """Start offsets of the non-overlapping windows of block_size + 1 tokens (evenly thinned to max_windows)."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    if max_windows and len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).round().astype(int)]
    return starts


@torch.no_grad()
def evaluate_tokens(model: GPT, tokens: np.ndarray, token_nbytes: np.ndarray, *, max_windows: int = 0,
                    batch_size: int = 16, device: str = "cpu", progress: bool = False,
                    label: str = "eval") -> dict[str, Any]:
    """Score `tokens` (a 1-D id array); `token_nbytes[id]` is each token's length in bytes."""
    model.eval()
    T = context_len(model)
    starts = window_starts(len(tokens), T, max_windows)
    if len(starts) == 0:
        raise ValueError(f"need more than block_size={T} tokens to evaluate, got {len(tokens)}")
    total_nats, total_tokens, total_bytes, total_correct = 0.0, 0, 0, 0
    with progress_bar(label, len(starts), progress) as advance:
        for b in range(0, len(starts), batch_size):
            win = np.stack([tokens[s:s + T + 1] for s in starts[b:b + batch_size]]).astype(np.int64)
            x = torch.from_numpy(win[:, :-1]).to(device)
            y = torch.from_numpy(win[:, 1:]).to(device)
            logits, _ = model(x)
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
            total_nats += float(nll)
            total_correct += int((logits.argmax(dim=-1) == y).sum())
            total_tokens += y.numel()
            total_bytes += int(token_nbytes[win[:, 1:]].sum())
            advance(len(win))
    loss = total_nats / total_tokens
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": total_nats / math.log(2) / total_bytes,
        "accuracy": total_correct / total_tokens,
        "tokens": total_tokens,
        "bytes": total_bytes,
        "windows": int(len(starts)),
    }
