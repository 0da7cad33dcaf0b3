"""The contiguous KV cache: keys and values of past positions, kept so decoding is O(T) per token.

Without a cache, generating token t re-runs attention over all t previous tokens
for every layer (O(T^2) work per sequence). With it, each step computes q, k, v
for the one new token only and attends over the stored keys/values.

Layout: one preallocated tensor each for K and V of shape
    [n_layer, batch, n_kv_head, max_len, head_dim]
so an update is a slice assignment (no reallocation, no concatenation) and the
memory the cache will ever use is known up front: `nbytes`.
"""
from __future__ import annotations

from typing import Any

import torch


class CacheFullError(RuntimeError):
    """Raised when an update would write past `max_len`."""


class KVCache:
    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # positions filled so far (the same for every sequence in the batch)

    @classmethod
    def for_model(cls, cfg: Any, batch: int = 1, max_len: int | None = None,
                  dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "KVCache":
        """cfg: a GPTConfig or LlamaConfig (n_layer, n_kv_head, head_dim, max_seq_len)."""
        return cls(cfg.n_layer, batch, cfg.n_kv_head, max_len or cfg.max_seq_len, cfg.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, nh, T, hd] at positions start_pos..start_pos+T-1; return views of 0..start_pos+T-1."""
        end = start_pos + k.size(2)
        if end > self.max_len:
            raise CacheFullError(f"KV cache holds {self.max_len} positions, update needs {end}")
        self.k[layer, :, :, start_pos:end] = k
        self.v[layer, :, :, start_pos:end] = v
        if layer == self.k.size(0) - 1:
            self.length = end
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]
