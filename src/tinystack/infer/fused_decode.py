"""A decode step without per-layer Python: all layers of a Llama-family model for D one-token rows, one C++ call.

    FusedDecode.build(model, storage, device) -> FusedDecode, or None where this model/cache cannot take it
    fused.run(batch) -> logits [D, V]          batch = [(seq, 1), ...]: every row a decode

    ids [D] -> embed_tokens -> x [D, H] --(quant/decode_step.cpp: every layer; KV written and read in place
    through the block tables)--> norm -> lm_head -> logits

The ModelRunner uses it for steps whose rows are all decodes (the steady state of continuous batching, and
every step of batch-1 generation); prefill chunks, mixed steps and speculative verification take the model's
own forward over the BatchView, which stays the reference the fused step is tested against.
What it takes: a Llama (model/llama.py) with fused projections, linear layers in float32 or in the engine's
quantised formats (QuantLinear), a float32 KV cache on the CPU, and the C++ extension (quant/kernels.py);
anything else returns None from build() and the step runs as before. From GEMM_MIN_ROWS rows on the model's
forward runs too: there the quantised layers switch to a float GEMM, and the step stays one arithmetic.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import BLOCK_FORMATS
from tinystack.infer.quant.linear import QuantLinear
from tinystack.infer.sequence import Sequence

_F32, _BF16 = -1, 3  # decode_step.cpp's kinds besides the block formats
_EMPTY = torch.empty(0)


def _linear_parts(layer: nn.Module) -> tuple[int, list[torch.Tensor]] | None:
    """(kind, [a, b, c, bias]) as decode_step.cpp takes a linear layer, or None for a type it does not run."""
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


class FusedDecode:
    def __init__(self, model: nn.Module, layers, storage: KVStorage):
        self.model, self.layers, self.storage = model, layers, storage
        cfg = model.config
        self.cos, self.sin = (t.contiguous() for t in model._rope_tables(torch.device("cpu")))
        self.max_positions = cfg.max_position_embeddings

    @classmethod
    def build(cls, model: nn.Module, storage: KVStorage, device: torch.device) -> FusedDecode | None:
        if device.type != "cpu" or storage.k.dtype != torch.float32 or not hasattr(model, "_rope_tables"):
            return None
        if kernels.default_path() == "torch" or kernels.extension() is None:
            return None
        cfg = model.config
        norms, kinds, parts = [], [], []
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            if not (attn.fused and mlp.fused):
                return None  # e.g. LoRA wrappers, which fuse_projections leaves separate
            for norm in (block.input_layernorm, block.post_attention_layernorm):
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
        path = 1 if kernels.default_path() == "avx512" else 0
        layers = kernels.extension().DecodeLayers(dims, cfg.rms_norm_eps, norms, kinds, parts, path)
        return cls(model, layers, storage)

    def accepts(self, batch: list[tuple[Sequence, int]]) -> bool:
        return len(batch) < kernels.GEMM_MIN_ROWS and all(n == 1 for _, n in batch)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> torch.Tensor:
        """-> logits [D, V] at each row's new token (its token at seq.num_computed, now written to the cache)."""
        seqs = [seq for seq, _ in batch]
        pos = [seq.num_computed for seq in seqs]
        if max(pos) >= self.max_positions:
            raise ValueError(f"position {max(pos)} exceeds max_position_embeddings={self.max_positions}")
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs])
        x = self.model.model.embed_tokens(torch.tensor([seq.token_ids[p] for seq, p in zip(seqs, pos)]))
        h = self.layers.step(x.float(), self.cos, self.sin, torch.tensor(pos), self.storage.k, self.storage.v, tables)
        return self.model.lm_head(self.model.model.norm(h)).float()
