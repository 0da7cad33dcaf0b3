"""The Llama family in PyTorch: Llama, TinyLlama, SmolLM, Mistral-style GQA, and Qwen2 (QKV bias).

    idx [B, T] -> embed_tokens -> n_layer x Block -> RMSNorm -> lm_head -> logits [B, T, V]
    Block:  x = x + attn(rms(x));  x = x + mlp(rms(x))
    attn:   q, k, v projections (k/v with n_kv_head <= n_head heads: grouped-query attention),
            rotary position embedding on q and k, causal attention (model.attention)
    mlp:    down(silu(gate(x)) * up(x))                                   (SwiGLU)

Parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so a
checkpoint's safetensors load by name with no renaming. The forward signature and the
KV-cache interface are the GPT's: `forward(idx, targets, kv_cache, positions, logit_index)`.
`fuse_projections()` turns q/k/v into one qkv_proj and gate/up into one gate_up_proj (model/fused_linear.py:
same logits, fewer matmuls, state_dict names unchanged); the engine and the trainer call it. Under CPU bf16
autocast (training) a fused model's norms, rotary + q/k/v split and SwiGLU run as kernels/fused_ops' C++ passes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinystack.kernels import fused_ops
from tinystack.model.attention import KVCache, causal_attention
from tinystack.model.fused_linear import fuse_rows
from tinystack.model.gpt import head_and_loss


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int = 128
    intermediate_size: int = 344
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4
    head_dim: int = 0  # 0 = hidden_size // n_head
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None: plain RoPE; {"rope_type": "linear", "factor"} or {"rope_type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"} (Llama 3.1 / 3.2): rope_inv_freq scales the frequencies
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2: True (q, k, v projections carry biases)
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k (weights [head_dim]) before RoPE
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.n_head
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in float32, as Hugging Face does, so bfloat16 models normalise the same way; one fused kernel
        if self.weight.dtype == torch.float32 and fused_ops.active(x):
            return fused_ops.rms_norm(x, self.weight, self.eps)  # bf16 out: only matmuls read a norm's output
        if x.dtype == self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None, device=None) -> torch.Tensor:
    """RoPE's hd/2 inverse frequencies theta^(-2i/hd), scaled as `scaling` says (LlamaConfig.rope_scaling).

    linear: every frequency / factor. llama3: the context was extended from original_max_position_embeddings
    (L) by `factor`; a frequency whose wavelength 2 pi / f is short (< L / high_freq_factor: it turns many times
    within L, local positions) is kept, a long one (> L / low_freq_factor) is divided by factor, and the ones
    between are interpolated in L / wavelength, as Meta's reference code and transformers do."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)  # 0 at the long end of the band, 1 at the short end
        between = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(wavelen < old_len / high, inv_freq,
                           torch.where(wavelen > old_len / low, inv_freq / factor, between))
    if kind != "default":
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq


def rotary_table(n_positions: int, head_dim: int, theta: float, device=None,
                 scaling: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, signed sin [n_positions, head_dim] for positions 0..n-1, in Hugging Face's half-split layout (the
    two halves share frequencies; rope_inv_freq's, scaled by `scaling`). The sin's first half is negated, so
    that rotate_half(x) * sin (HF's form, rotate_half(x) = cat(-x2, x1)) is roll(x, hd/2) * signed sin: one op
    instead of chunk, neg and cat."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, device)
    freqs = torch.arange(n_positions, device=device, dtype=torch.float32)[:, None] * inv_freq  # [n, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = emb.sin()
    sin[:, : head_dim // 2].neg_()
    return emb.cos(), sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, hd] rotated by cos, signed_sin [B, T, 1, hd] (rotary_table), computed in float32 (the float32
    tables promote a bfloat16 x), returned in x's dtype."""
    out = torch.addcmul(x * cos, x.roll(x.size(-1) // 2, dims=-1), signed_sin)
    return out if out.dtype == x.dtype else out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.n_head * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_head * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_head * hd, bias=cfg.attention_bias)
        # attention_bias: Llama / Mistral / Qwen3 put a bias on all four projections, Qwen2 on q, k, v only
        self.o_proj = nn.Linear(cfg.n_head * hd, cfg.hidden_size, bias=cfg.attention_bias and cfg.model_type != "qwen2")
        if cfg.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, cfg.rms_norm_eps), RMSNorm(hd, cfg.rms_norm_eps)
        self.fused = False

    def fuse(self) -> None:
        """q, k, v projections -> one qkv_proj (one matmul, and q and k rotated in one pass)."""
        self.fused = self.fused or fuse_rows(self, ["q_proj", "k_proj", "v_proj"], "qkv_proj")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        c = self.cfg
        if self.fused and kv_cache is None and fused_ops.active(x) and not c.qk_norm:  # bf16 training: one pass
            qkv = self.qkv_proj(x).view(B, T, c.n_head + 2 * c.n_kv_head, c.head_dim)
            q, k, v = fused_ops.rope_split(qkv, cos, sin, c.n_head, c.n_kv_head)  # float32 [B, heads, T, hd]
            y = causal_attention(q, k, v, self.layer_idx).transpose(1, 2)  # [B, T, nh, hd], bf16 or float32
            # heads back side by side, cast to bf16 in the same pass (the o_proj matmul would cast it)
            bf16 = torch.bfloat16
            y = y.contiguous() if y.dtype == bf16 else y.to(bf16, memory_format=torch.contiguous_format)
            return self.o_proj(y.view(B, T, c.n_head * c.head_dim))
        if self.fused:
            qkv = self.qkv_proj(x).view(B, T, c.n_head + 2 * c.n_kv_head, c.head_dim)
            qk = qkv[:, :, :c.n_head + c.n_kv_head]
            if c.qk_norm:
                qk = torch.cat([self.q_norm(qk[:, :, :c.n_head]), self.k_norm(qk[:, :, c.n_head:])], dim=2)
            q, k = apply_rotary(qk, cos, sin).split([c.n_head, c.n_kv_head], dim=2)
            v = qkv[:, :, c.n_head + c.n_kv_head:]
        else:
            q = self.q_proj(x).view(B, T, c.n_head, c.head_dim)
            k = self.k_proj(x).view(B, T, c.n_kv_head, c.head_dim)
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            v = self.v_proj(x).view(B, T, c.n_kv_head, c.head_dim)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.layer_idx, kv_cache)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, c.n_head * c.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.fused = False

    def fuse(self) -> None:
        """gate and up projections -> one gate_up_proj (one matmul)."""
        self.fused = self.fused or fuse_rows(self, ["gate_proj", "up_proj"], "gate_up_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and fused_ops.active(x):
            return self.down_proj(fused_ops.swiglu(self.gate_up_proj(x)))
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv_cache):
        x = _residual(x, self.self_attn(self.input_layernorm(x), cos, sin, kv_cache))
        return _residual(x, self.mlp(self.post_attention_layernorm(x)))


def _residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y; under bf16 training (a float32 stream, a bf16 branch) in one pass instead of a cast and an add."""
    if x.dtype == torch.float32 and y.dtype == torch.bfloat16 and x.shape == y.shape and fused_ops.active(x):
        return fused_ops.residual_add(x, y)
    return x + y


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
            norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        ))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def tie_weights(self) -> None:
        """With tie_word_embeddings the head is the embedding matrix (one Parameter); again after the parameters
        were replaced (model.io's loader)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """Fused QKV and gate/up projections in every layer (model/fused_linear.py): the same logits from fewer,
        larger matmuls (inference and training). state_dict keeps Hugging Face's names."""
        for block in self.model.layers:
            block.self_attn.fuse()
            block.mlp.fuse()

    def rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [max_position_embeddings, hd] in float32, built once per device (a plain attribute,
        not a buffer: it stays float32 when the model is cast, and out of state_dict)."""
        table = getattr(self, "_rope_table", None)
        if table is None or table[0].device != device:
            c = self.config
            table = self._rope_table = rotary_table(c.max_position_embeddings, c.head_dim, c.rope_theta, device,
                                                    c.rope_scaling)
        return table

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, 1, hd] at `positions` [B, T]."""
        cos, sin = self.rope_tables(positions.device)
        return cos[positions][:, :, None], sin[positions][:, :, None]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                positions: torch.Tensor | None = None,
                logit_index: torch.Tensor | None = None,
                apply_head: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] at positions 0..T-1 (or `positions` [B, T]) -> (logits [B, T, V], loss or None).

        `logit_index` [B]: logits only at that position of each row -> [B, 1, V]; a bool [B, T] mask: only
        where True -> [K, 1, V]; `apply_head=False`: the head's input in place of the logits (see GPT.forward)."""
        B, T = idx.shape
        if positions is None:
            if T > self.config.max_position_embeddings:
                raise ValueError(f"sequence of {T} tokens exceeds "
                                 f"max_position_embeddings={self.config.max_position_embeddings}")
            positions = torch.arange(T, device=idx.device).expand(B, T)
        cos, sin = self._rotary(positions)
        x = self.model.embed_tokens(idx)
        for block in self.model.layers:
            x = block(x, cos, sin, kv_cache)
        return head_and_loss(x, self.model.norm, self.lm_head, targets, logit_index, apply_head)
