"""The PyTorch GPT: GPT-2's architecture, small enough to read in one sitting.

    idx [B, T] -> token embedding + position embedding -> n_layer x Block -> ln_f -> lm_head -> logits [B, T, V]
    Block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))          (pre-LayerNorm, residual stream)

It is exactly GPT-2 (tanh-GELU, LayerNorm eps 1e-5, biases, tied input/output
embeddings), so a model directory written by `model.io` is also a valid Hugging
Face GPT-2 checkpoint and vice versa; module names follow GPT-2's
(`transformer.h.0.attn.c_attn`, ...) so the NumPy backend can mirror them.

Incremental decoding: `forward(idx, kv_cache=view, positions=pos)` feeds the tokens at
`positions` [B, T] and attends through the cache (`model.attention`: the cache's `attend`
stores their keys/values and attends over each sequence's history). The inference
engine packs its ragged batches into one row ([1, N]) and a BatchView that separates them.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinystack.model.attention import KVCache, causal_attention
from tinystack.model.gpt_config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, nh, T, hd]: heads become a batch dimension for the attention matmuls
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v, self.layer_idx, kv_cache, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache)
        return x + self.mlp(self.ln_2(x))


def select_positions(x: torch.Tensor, logit_index: torch.Tensor) -> torch.Tensor:
    """Hidden states x [B, T, C] at `logit_index` -> [R, 1, C]: one position per row ([B] indices; with B = 1
    and a packed batch [R] positions of the one row), or every position where a bool [B, T] mask is True."""
    if logit_index.dtype == torch.bool:
        return x[logit_index][:, None]
    return x[torch.arange(x.size(0), device=x.device), logit_index][:, None]


def head_and_loss(x: torch.Tensor, norm: nn.Module, head: nn.Module, targets: torch.Tensor | None,
                  logit_index: torch.Tensor | None, apply_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The last blocks' output x [B, T, C] -> (logits, mean cross-entropy against `targets` or None), as both
    families' forward ends: positions picked (`logit_index`, see select_positions), the final norm, the head;
    `apply_head=False` returns the norm's output in place of the logits (and allows no targets)."""
    if logit_index is not None:
        x = select_positions(x, logit_index)
    x = norm(x)
    if not apply_head:
        assert targets is None, "targets need the logits"
        return x, None
    logits = head(x)
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
    return logits, loss


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) so the residual stream
        # does not grow with depth (each block adds two of them)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def tie_weights(self) -> None:
        """Weight tying: one matrix in and out (again after the parameters were replaced: model.io's loader)."""
        self.lm_head.weight = self.transformer.wte.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
        apply_head: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] token ids at positions 0..T-1 -> (logits [B, T, V], mean cross-entropy or None).

        `positions` [B, T]: where the tokens sit instead (with a `kv_cache`, after its history).
        `logit_index` [B] computes logits only at that position of each row -> [B, 1, V]
        (with B = 1 and a packed batch, [R] positions of the one row -> [R, 1, V])
        (a prefill needs the last token's logits only; the head is the biggest matmul);
        a bool [B, T] mask instead: logits only where it is True, [K, 1, V] in row-major order
        (training: only the positions with a target, e.g. a chat's assistant tokens).
        `targets` uses -100 for positions to ignore. Raises ValueError if the positions
        run past `block_size` (there is no position embedding for them).
        `apply_head=False` returns the head's input (the final norm's output [.., C]) in place of the logits,
        for a loss that applies a frozen head itself (train/frozen_head.py); `targets` is then not allowed.
        """
        B, T = idx.shape
        if positions is None:
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens exceeds block_size={self.config.block_size}")
            pos = torch.arange(T, device=idx.device)
        else:
            pos = positions
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, kv_cache)
        return head_and_loss(x, self.transformer.ln_f, self.lm_head, targets, logit_index, apply_head)
