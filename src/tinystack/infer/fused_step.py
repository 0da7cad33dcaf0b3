"""A model step without per-layer Python: all layers of a Llama-family model for the step's tokens, one C++ call.

    FusedStep.build(model, storage, device) -> FusedStep, or None where this model/cache cannot take it
    fused.run(ids, tables, starts, lengths, index) -> logits [len(index), V]

    ids [N] (rows packed) -> embed_tokens -> x [N, H] --(kernels/quant/fused_step.cpp: every layer; each token's K/V
    written at its slot, then each token attends over its row's keys up to its position, read in place
    through the block table)--> the hidden states at `index` -> norm -> lm_head -> logits

The ModelRunner sends it every step of fewer than GEMM_MIN_ROWS tokens: decodes (every step of batch-1
generation after the prompt, and the steady state of continuous batching), speculative verification rows and
short prefill chunks. One arithmetic for all of them: a token's logits do not depend on whether it came as a
decode or inside a verification row, so speculative decoding under greedy sampling gives exactly the tokens of
plain decoding. Longer steps take the model's own forward over the BatchView (its quantised layers then
switch to a float GEMM), which is also the reference the fused step is tested against.
What it takes: a Llama (model/llama.py) with fused projections, linear layers in float32 or in the engine's
quantised formats (QuantLinear), a float32 KV cache on the CPU, and the C++ extension (kernels/quant);
anything else returns None from build() and every step runs the model's forward.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import BLOCK_FORMATS
from tinystack.infer.quant.linear import QuantLinear
from tinystack.kernels import quant as quant_kernels

_F32, _BF16 = -1, 3  # fused_step.cpp's kinds besides the block formats
_EMPTY = torch.empty(0)


def _linear_parts(layer: nn.Module) -> tuple[int, list[torch.Tensor]] | None:
    """(kind, [a, b, c, bias]) as fused_step.cpp takes a linear layer, or None for a type it does not run."""
    if type(layer) is nn.Linear and layer.weight.dtype == torch.float32:
        bias = _EMPTY if layer.bias is None else layer.bias.detach()
        return _F32, [layer.weight.detach(), _EMPTY, _EMPTY, bias]
    if isinstance(layer, QuantLinear):
        p = layer.packed
        bias = _EMPTY if layer.bias is None else layer.bias.detach().float()
        if p.fmt == "bf16":
            return _BF16, [p.qs, _EMPTY, _EMPTY, bias]
        return BLOCK_FORMATS[p.fmt], [p.qs, p.d, _EMPTY if p.m is None else p.m, bias]
    return None


class FusedStep:
    def __init__(self, model: nn.Module, layers, storage: KVStorage):
        self.model, self.layers, self.storage = model, layers, storage
        self.cos, self.sin = (t.contiguous() for t in model.rope_tables(torch.device("cpu")))  # the model's own
        self.max_positions = model.config.max_position_embeddings

    @classmethod
    def build(cls, model: nn.Module, storage: KVStorage, device: torch.device) -> FusedStep | None:
        if device.type != "cpu" or storage.k.dtype != torch.float32 or not hasattr(model, "rope_tables"):
            return None
        if quant_kernels.default_path() == "torch" or quant_kernels.extension() is None:
            return None
        cfg = model.config
        norms, kinds, parts = [], [], []
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            if not (attn.fused and mlp.fused):
                return None  # e.g. LoRA wrappers, which fuse_projections leaves separate
            qk = (attn.q_norm, attn.k_norm) if cfg.qk_norm else ()  # Qwen3: per-head q/k norms
            for norm in (block.input_layernorm, block.post_attention_layernorm, *qk):
                if norm.weight.dtype != torch.float32:
                    return None
                norms.append(norm.weight.detach())
            for layer in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                lin = _linear_parts(layer)
                if lin is None:
                    return None
                kinds.append(lin[0])
                parts += lin[1]
        dims = [cfg.n_layer, cfg.hidden_size, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.intermediate_size]
        path = quant_kernels.PATH_CODES[quant_kernels.default_path()]
        layers = quant_kernels.extension().FusedLayers(dims, cfg.rms_norm_eps, norms, kinds, parts, path)
        return cls(model, layers, storage)

    def accepts(self, n_tokens: int) -> bool:
        return n_tokens < kernels.GEMM_MIN_ROWS

    @torch.inference_mode()
    def run(self, ids: list[int], tables: list[list[int]], starts: list[int], lengths: list[int],
            index: list[int]) -> torch.Tensor:
        """Row r feeds ids[sum(lengths[:r]):][:lengths[r]] at positions starts[r]... over block table tables[r];
        -> logits [len(index), V] at the packed positions `index`."""
        if max(s + n for s, n in zip(starts, lengths)) > self.max_positions:
            raise ValueError(f"a sequence exceeds max_position_embeddings={self.max_positions}")
        pos = [p for s, n in zip(starts, lengths) for p in range(s, s + n)]
        rows = [r for r, n in enumerate(lengths) for _ in range(n)]
        width = max(len(t) for t in tables)
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        x = self.model.model.embed_tokens(torch.tensor(ids))
        h = self.layers.step(x.float(), self.cos, self.sin, torch.tensor(pos), torch.tensor(rows), self.storage.k,
                             self.storage.v, padded)
        h = h.index_select(0, torch.tensor(index))
        return self.model.lm_head(self.model.model.norm(h)).float()
