"""Causal attention over an optional KV cache, shared by every model family (GPT-2, Llama).

    q [B, nh, T, hd], k/v [B, nkv, T, hd]  --cache.update-->  k/v [B, nkv, S, hd]
    mask: the causal triangle offset by S - T (every row at the same positions);
          a packed ragged batch goes to the cache's own `attend` instead
    -> scaled_dot_product_attention (grouped-query: nkv may divide nh) -> [B, nh, T, hd]

The cache protocol is `update(layer, k, v, start_pos) -> (k_all, v_all)`; a cache that
packs sequences of different lengths into one row (the inference engine's BatchView)
instead implements `attend(layer, q, k, v) -> y` and does the attention itself, per sequence.
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
    if kv_cache is not None and hasattr(kv_cache, "attend"):
        return kv_cache.attend(layer, q, k, v)
    if kv_cache is not None:
        k, v = kv_cache.update(layer, k, v, start_pos)
    gqa = k.size(1) != q.size(1)
    S = k.size(2)
    if S == T:  # no history: the plain causal triangle
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa)
    if T == 1:  # one new token sees every cached key
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    # queries sit at positions S-T..S-1 and may see keys 0..their own position
    q_pos = torch.arange(S - T, S, device=q.device)[:, None]
    mask = torch.arange(S, device=q.device)[None, :] <= q_pos  # [T, S], True = attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
