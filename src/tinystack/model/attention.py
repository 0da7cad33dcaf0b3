"""Causal attention, with or without a KV cache, shared by every model family (GPT-2, Llama).

    no cache (training, a full forward):  q [B, nh, T, hd], k/v [B, nkv, T, hd]
        -> scaled_dot_product_attention, the causal triangle (grouped-query: nkv may divide nh);
        under CPU bf16 autocast kernels/fused_attention's bf16 path where it serves (result bf16),
        else in float32 (see below), the result too
    a cache (the inference engine):      kv_cache.attend(layer, q, k, v) -> y
        the cache stores the new keys/values and attends each query over its own sequence's
        history; it knows where each sequence's tokens sit, the model does not

One cache interface, `KVCache.attend`: the engine's `BatchView` (infer/paged_cache.py) is
the implementation, for both its paged and its contiguous storage.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from tinystack.kernels import fused_attention


class KVCache(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k/v for `layer`, return the attention output of q over the cached history."""
        ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                     kv_cache: KVCache | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    if kv_cache is not None:
        return kv_cache.attend(layer, q, k, v)
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        if dropout_p == 0.0 and fused_attention.serves(q, k):  # bf16 products, float32 softmax, one pass each
            with torch.autocast("cpu", enabled=False):
                return fused_attention.attention(q, k, v)
        # otherwise attention in float32 (q, k, v may come in float32 already: model.fused_ops). The
        # projections around it keep autocast's bf16 matmuls, but torch's CPU flash-attention backward
        # in bf16 ran several times slower than in float32 (profiled on the Xeons with AMX we have), and
        # softmax/exp are where bf16 loses accuracy.
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                  dropout_p=dropout_p, enable_gqa=k.size(1) != q.size(1))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p,
                                          enable_gqa=k.size(1) != q.size(1))
