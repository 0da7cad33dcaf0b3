"""The reference for training speed: nanoGPT's model.py + train.py loop, written out in plain PyTorch.

Same architecture as tinystack's GPT (GPT-2: pre-LayerNorm, biases, tanh-GELU, tied embeddings,
SDPA causal attention) and nanoGPT's CPU training step: random windows from the token array,
forward, cross-entropy, backward, clip to norm 1, AdamW (torch's default CPU implementation, as
nanoGPT uses fused only on CUDA), zero_grad(set_to_none=True), the loss read with .item() every step
(nanoGPT's README CPU command logs every step), the val loss on `eval_iters` batches every `eval_interval`
steps (nanoGPT scores train and val there; only val here, as our loop does). No trainer, no logging, no
checkpoints.

`BareLoop(..., dtype="bfloat16", fused=True)` is the same loop with our settings applied (bf16 autocast
with float32 attention, as `tinystack.model.attention` does; fused AdamW and foreach clipping, as
`tinystack.train.loop` does): the fair comparison for our loop's own overhead. The defaults are nanoGPT
as it ships for CPU (float32, unfused AdamW, no compile).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class _Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head, self.attn_fp32 = n_head, False
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attn_fp32:  # under bf16 autocast: as tinystack's attention does on CPU
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class BareGPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_layer: int, n_head: int, d: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.h = nn.ModuleList(_Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class BareLoop:
    """nanoGPT's training loop state; `run(n)` does n more steps and returns their wall seconds. `starts` holds
    the perf_counter reading at the start of every step (bench_common.step_periods turns them into step times)."""

    def __init__(self, tokens: np.ndarray, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 batch_size: int, cfg, seed: int = 1337, *, dtype: str = "float32", fused: bool = False,
                 val_batches=None):
        torch.manual_seed(seed)
        self.tokens, self.T, self.B, self.cfg = tokens, block_size, batch_size, cfg
        self.model = BareGPT(vocab, block_size, n_layer, n_head, n_embd)
        self.bf16, self.fused, self.val_batches, self.val = dtype == "bfloat16", fused, val_batches, float("nan")
        for block in self.model.h:
            block.attn_fp32 = self.bf16
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=fused or None)
        self.step, self.loss, self.starts = 0, float("nan"), []

    def _lr(self, it: int) -> float:  # nanoGPT's get_lr: linear warmup, cosine to min_lr
        c = self.cfg
        if it < c.warmup_iters:
            return c.learning_rate * (it + 1) / (c.warmup_iters + 1)
        ratio = min(1.0, (it - c.warmup_iters) / max(1, c.max_iters - c.warmup_iters))
        return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c.learning_rate - c.min_lr)

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.starts.append(time.perf_counter())
            for g in self.opt.param_groups:
                g["lr"] = self._lr(self.step)
            ix = torch.randint(len(self.tokens) - self.T, (self.B,))
            x = torch.stack([torch.from_numpy(self.tokens[i:i + self.T].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(self.tokens[i + 1:i + 1 + self.T].astype(np.int64)) for i in ix])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip, foreach=self.fused or None)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.loss = loss.item()
            self.step += 1
            if self.val_batches and (self.step % self.cfg.eval_interval == 0 or self.step == self.cfg.max_iters):
                self.val = self.val_loss(self.val_batches)
        return time.perf_counter() - t0

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        self.model.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            out = float(np.mean([self.model(torch.from_numpy(x), torch.from_numpy(y)).item() for x, y in batches]))
        self.model.train()
        return out
