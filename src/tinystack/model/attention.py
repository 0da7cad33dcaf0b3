"""Causal attention over an optional KV cache, shared by every model family (GPT-2, Llama).

    q [B, nh, T, hd], k/v [B, nkv, T, hd]  --cache.update-->  k/v [B, nkv, S, hd]
    mask: the cache's own `attn_mask` [B, 1, T, S] when it has one (a ragged batch:
          each row has its own positions and context length), else the causal
          triangle offset by S - T (every row at the same positions)
    -> scaled_dot_product_attention (grouped-query: nkv may divide nh) -> [B, nh, T, hd]

The cache protocol is `update(layer, k, v, start_pos) -> (k_all, v_all)`; a cache
that batches sequences of different lengths also exposes `attn_mask` (bool, True =
attend, or None when every key is visible to every query).
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class KVCacheLike(Protocol):
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                     kv_cache: KVCacheLike | None = None, start_pos: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
    T = q.size(2)
    if kv_cache is not None:
        k, v = kv_cache.update(layer, k, v, start_pos)
    gqa = k.size(1) != q.size(1)
    S = k.size(2)
    if kv_cache is not None and hasattr(kv_cache, "attn_mask"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=kv_cache.attn_mask, enable_gqa=gqa)
    if S == T:  # no history: the plain causal triangle
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa)
    if T == 1:  # one new token sees every cached key
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    # queries sit at positions S-T..S-1 and may see keys 0..their own position
    q_pos = torch.arange(S - T, S, device=q.device)[:, None]
    mask = torch.arange(S, device=q.device)[None, :] <= q_pos  # [T, S], True = attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
