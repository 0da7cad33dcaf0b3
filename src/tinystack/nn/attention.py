"""Causal multi-head self-attention, forward and backward by hand.

    x [B, T, C] --c_attn--> q, k, v [B, nh, T, hd]
    S = q k^T / sqrt(hd)  (future positions masked to -inf)  P = softmax(S)  [B, nh, T, T]
    y = P v  [B, nh, T, hd] --merge heads--> [B, T, C] --c_proj--> out

Parameter names equal the PyTorch GPT's (`c_attn.weight`, `c_proj.bias`, ...), and the
math equals `F.scaled_dot_product_attention(is_causal=True)`; the backward is checked
against finite differences and torch autograd in tests/nn.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from tinystack.nn.layers import Dropout, Linear
from tinystack.nn.module import Module


class CausalSelfAttention(Module):
    """x [B, T, C] -> [B, T, C]. `dropout` applies to the attention probabilities and to the output."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, *, dtype: DTypeLike = np.float32,
                 rng: np.random.Generator | None = None, seed: int = 0) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn = Linear(n_embd, 3 * n_embd, dtype=dtype, rng=rng)  # q, k, v in one matmul
        self.c_proj = Linear(n_embd, n_embd, dtype=dtype, rng=rng)
        self.attn_drop = Dropout(dropout, seed=seed + 1)
        self.resid_drop = Dropout(dropout, seed=seed + 2)

    def _heads(self, t: np.ndarray) -> np.ndarray:
        """[B, T, C] -> [B, nh, T, hd]: heads become a batch dimension."""
        B, T, C = t.shape
        return t.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)

    def _merge(self, t: np.ndarray) -> np.ndarray:
        """[B, nh, T, hd] -> [B, T, C] (the inverse of `_heads`)."""
        B, nh, T, hd = t.shape
        return t.transpose(0, 2, 1, 3).reshape(B, T, nh * hd)

    def forward(self, x: np.ndarray) -> np.ndarray:
        B, T, C = x.shape
        qkv = self.c_attn.forward(x)
        q, k, v = (self._heads(qkv[..., i * C:(i + 1) * C]) for i in range(3))
        scale = 1.0 / math.sqrt(C // self.n_head)
        s = (q @ k.transpose(0, 1, 3, 2)) * x.dtype.type(scale)
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # key j > query i is not visible
        s = np.where(future, -np.inf, s)
        s = s - s.max(axis=-1, keepdims=True)  # the diagonal is never masked, so every row has a finite max
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        pd = self.attn_drop.forward(p)
        y = pd @ v
        self._cache = (q, k, v, p, pd, scale)
        return self.resid_drop.forward(self.c_proj.forward(self._merge(y)))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        q, k, v, p, pd, scale = self._cache
        dy = self._heads(self.c_proj.backward(self.resid_drop.backward(dout)))
        # y = Pd v  ->  dPd = dy v^T,  dv = Pd^T dy
        dpd = dy @ v.transpose(0, 1, 3, 2)
        dv = pd.transpose(0, 1, 3, 2) @ dy
        dp = self.attn_drop.backward(dpd)
        # softmax along the last axis: dS_ij = P_ij (dP_ij - sum_l dP_il P_il); masked entries have P = 0 -> dS = 0
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        ds *= ds.dtype.type(scale)
        # S = scale q k^T  ->  dq = dS k scale,  dk = dS^T q scale  (scale already folded into ds)
        dq = ds @ k
        dk = ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([self._merge(dq), self._merge(dk), self._merge(dv)], axis=-1)
        return self.c_attn.backward(dqkv)

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}"
