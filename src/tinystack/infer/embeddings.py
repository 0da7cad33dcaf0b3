"""Sentence embeddings from a causal language model: its final norm's output, pooled over an input's tokens.

    embed(model, inputs, pooling)   inputs: token-id lists -> float32 [len(inputs), hidden], each row L2-normalised
        pooling "last": the last token's state (it has attended to every token before it: the usual choice
                        for a decoder-only model, and vLLM's default for one)
        pooling "mean": the mean of every token's state

Run it where the model may be run (the engine thread: AsyncEngine.call); inputs go one at a time, so the
activations are one input's, never more than the context allows. It uses the model contract's forward
(apply_head=False: the hidden states, no KV cache), so it works in every weight format the engine loaded.
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch

Pooling = Literal["last", "mean"]


@torch.inference_mode()
def embed(model: torch.nn.Module, inputs: Sequence[Sequence[int]], pooling: Pooling) -> torch.Tensor:
    device = next(model.parameters()).device
    rows = []
    for ids in inputs:
        hidden, _ = model(torch.tensor([list(ids)], dtype=torch.long, device=device), apply_head=False)
        states = hidden[0].float()  # [T, hidden]
        rows.append(states[-1] if pooling == "last" else states.mean(dim=0))
    out = torch.stack(rows) if rows else torch.empty(0, 0)
    return torch.nn.functional.normalize(out, dim=-1) if rows else out
