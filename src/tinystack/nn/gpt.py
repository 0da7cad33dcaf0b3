"""The NumPy GPT: the PyTorch GPT's architecture and parameter names, backward by hand.

    idx [B, T] -> wte(idx) + wpe(0..T-1) -> drop -> n_layer x Block -> ln_f -> x @ wte^T -> logits [B, T, V]
    Block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))

`named_parameters()` yields exactly the names of `tinystack.model.gpt.GPT` minus the tied
`lm_head.weight` (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...), so
weights move between the backends by name (`nn/gpt_io.py`). The output head is the
token embedding itself (weight tying): its gradient from the logits and from the
input lookup land in the same array. Init follows the PyTorch GPT (N(0, 0.02), the
residual projections scaled by 1/sqrt(2 n_layer)), drawn from a seeded NumPy Generator.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from tinystack.model.gpt_config import GPTConfig
from tinystack.nn.attention import CausalSelfAttention
from tinystack.nn.layers import GELU, Dropout, Embedding, LayerNorm, Linear
from tinystack.nn.loss import softmax_cross_entropy
from tinystack.nn.module import Module, ModuleList


class FeedForward(Module):
    """c_fc (C -> 4C) -> tanh-GELU -> c_proj (4C -> C) -> dropout; named `mlp` in a Block, as in torch."""

    def __init__(self, n_embd: int, dropout: float, *, dtype: DTypeLike, rng: np.random.Generator, seed: int) -> None:
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, dtype=dtype, rng=rng)
        self.act = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, dtype=dtype, rng=rng)
        self.drop = Dropout(dropout, seed=seed)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.drop.forward(self.c_proj.forward(self.act.forward(self.c_fc.forward(x))))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return self.c_fc.backward(self.act.backward(self.c_proj.backward(self.drop.backward(dout))))


class Block(Module):
    def __init__(self, cfg: GPTConfig, *, dtype: DTypeLike, rng: np.random.Generator, seed: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, cfg.layer_norm_eps, dtype=dtype)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.dropout, dtype=dtype, rng=rng, seed=seed)
        self.ln_2 = LayerNorm(cfg.n_embd, cfg.layer_norm_eps, dtype=dtype)
        self.mlp = FeedForward(cfg.n_embd, cfg.dropout, dtype=dtype, rng=rng, seed=seed + 3)

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = x + self.attn.forward(self.ln_1.forward(x))
        return x + self.mlp.forward(self.ln_2.forward(x))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        # out = x1 + mlp(ln_2(x1)): the residual passes dout through unchanged and adds the branch's gradient
        dx1 = dout + self.ln_2.backward(self.mlp.backward(dout))
        return dx1 + self.ln_1.backward(self.attn.backward(dx1))


class Transformer(Module):
    """The `transformer.` prefix of every parameter name: wte, wpe, drop, h.{i}, ln_f."""

    def __init__(self, cfg: GPTConfig, *, dtype: DTypeLike, rng: np.random.Generator, seed: int) -> None:
        super().__init__()
        self.wte = Embedding(cfg.vocab_size, cfg.n_embd, dtype=dtype, rng=rng)
        self.wpe = Embedding(cfg.block_size, cfg.n_embd, dtype=dtype, rng=rng)
        self.drop = Dropout(cfg.dropout, seed=seed)
        self.h = ModuleList([Block(cfg, dtype=dtype, rng=rng, seed=seed + 10 * (i + 1)) for i in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd, cfg.layer_norm_eps, dtype=dtype)


class GPT(Module):
    """forward(idx [B, T] ints) -> logits [B, T, V]; backward(dlogits) fills every gradient (returns None)."""

    def __init__(self, cfg: GPTConfig, *, dtype: DTypeLike = np.float32, seed: int = 0) -> None:
        super().__init__()
        self.config = cfg
        rng = np.random.default_rng(seed)
        self.transformer = Transformer(cfg, dtype=dtype, rng=rng, seed=seed)
        for name, p in self.named_parameters():  # GPT-2 init, as tinystack.model.gpt.GPT
            if name.endswith("bias") and ".ln_" not in name:
                p[...] = 0
            elif p.ndim == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
                p[...] = rng.normal(0.0, std, p.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.transformer.wte.params["weight"].dtype

    def forward(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size={self.config.block_size}")
        tr = self.transformer
        x = tr.drop.forward(tr.wte.forward(idx) + tr.wpe.forward(np.arange(T)))
        for block in tr.h:
            x = block.forward(x)
        self._xf = tr.ln_f.forward(x)
        return self._xf @ tr.wte.params["weight"].T  # tied output head

    def backward(self, dlogits: np.ndarray) -> None:
        tr = self.transformer
        w, xf = tr.wte.params["weight"], self._xf
        C = w.shape[1]
        # logits = xf W^T  ->  dW += dlogits^T xf (head side of the tied matrix),  dxf = dlogits W
        tr.wte.grads["weight"] += dlogits.reshape(-1, w.shape[0]).T @ xf.reshape(-1, C)
        dx = tr.ln_f.backward(dlogits @ w)
        for block in reversed(tr.h.items):
            dx = block.backward(dx)
        dx = tr.drop.backward(dx)
        tr.wte.backward(dx)  # input side of the tied matrix: accumulates into the same gradient
        tr.wpe.backward(np.broadcast_to(dx.sum(axis=0), dx.shape[1:]))  # positions are shared by the batch

    def loss_and_grads(self, idx: np.ndarray, targets: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """zero_grad, forward, mean cross-entropy (IGNORE_INDEX targets skipped, as torch), backward.
        Returns (loss, {name: gradient}) - the module's own arrays, not copies."""
        self.zero_grad()
        loss, dlogits = softmax_cross_entropy(self.forward(idx), targets)
        self.backward(dlogits)
        return loss, self.gradients()

    def loss(self, idx: np.ndarray, targets: np.ndarray) -> float:
        """Mean cross-entropy without touching the gradients (dropout follows the training flag)."""
        return softmax_cross_entropy(self.forward(idx), targets)[0]
