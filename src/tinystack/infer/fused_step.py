"""A model step without per-layer Python: all layers of a Llama-family model for the step's tokens, one C++ call.

    FusedStep.build(model, storage, device) -> FusedStep, or None where this model/cache cannot take it
    fused.run(ids, tables, starts, lengths, index) -> logits [len(index), V]
    fused.take_loras(adapters) -> bool; fused.run(..., slots=[adapter of each token])  LoRA rows (infer/lora.py)

    ids [N] (rows packed) -> embed_tokens -> x [N, H] --(kernels/quant/fused_step.cpp: every layer; each token's K/V
    written at its slot, then each token attends over its row's keys up to its position, read in place
    through the block table)--> the hidden states at `index` -> norm -> lm_head -> logits

The ModelRunner sends it every step of fewer than GEMM_MIN_ROWS tokens: decodes (every step of batch-1
generation after the prompt, and the steady state of continuous batching), speculative verification rows and
short prefill chunks. One arithmetic for all of them: a token's logits do not depend on whether it came as a
decode or inside a verification row, so speculative decoding under greedy sampling gives exactly the tokens of
plain decoding. Longer steps take the model's own forward over the BatchView (its quantised layers then
switch to a float GEMM), which is also the reference the fused step is tested against.
What it takes is data (SUPPORTS): model/llama.py's modules exactly (a subclass may compute something else), the
model types and config fields it was written for, rope scalings the model's own tables express, fused projections,
linear layers in float32 or in the engine's quantised formats (QuantLinear), float32 norms, a float32 KV cache on
the CPU and the C++ extension (tinystack/kernels/quant). Anything else is refused: `refusal()` names why, build()
logs it and returns None, and every step runs the model's forward (the reference), never a silently different one.
LoRA adapters ride along: the AdapterSet's stacks of each fused projection (float32; take_loras refuses others,
and their steps run the forward) go to the C++ once per change of the resident set, and each token names its
adapter's place in them, so a step mixing adapters and the base is still one call.
"""
from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn as nn

from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import BLOCK_FORMATS
from tinystack.infer.quant.linear import QuantLinear
from tinystack.kernels import quant as quant_kernels
from tinystack.model.llama import MLP, Attention, Block, Llama, LlamaConfig, RMSNorm

log = logging.getLogger(__name__)

# What fused_step.cpp computes, as data: a new family, op or config feature is added here (and to the C++) on
# purpose, never taken by default. Exact module types: a subclass may override a forward the C++ does not follow.
SUPPORTS = {
    "modules": {"model": Llama, "config": LlamaConfig, "block": Block, "attention": Attention, "mlp": MLP,
                "norm": RMSNorm},
    "model_type": frozenset({"llama", "mistral", "qwen2", "qwen3"}),
    # the config fields whose every value the C++ follows (attention_bias / mlp_bias: biases passed per linear;
    # qk_norm: Qwen3's per-head norms; rope_theta / rope_scaling: read through the model's own rope_tables)
    "config_fields": frozenset({"vocab_size", "hidden_size", "intermediate_size", "n_layer", "n_head", "n_kv_head",
                                "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
                                "attention_bias", "qk_norm", "mlp_bias", "tie_word_embeddings", "model_type"}),
    "rope_scaling": frozenset({"default", "linear", "llama3"}),
}

_F32, _BF16 = -1, 3  # fused_step.cpp's kinds besides the block formats
_EMPTY, _EMPTY_LONG = torch.empty(0), torch.empty(0, dtype=torch.long)


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
        self._loras: tuple[int, int] | None = None  # (id, version) of the AdapterSet whose stacks the C++ holds
        self._lora_refused: str | None = None

    @classmethod
    def refusal(cls, model: nn.Module, storage: KVStorage, device: torch.device) -> str | None:
        """Why this model and cache cannot take the fused step (None: they can); see SUPPORTS."""
        if device.type != "cpu" or storage.k.dtype != torch.float32:
            return f"needs a float32 KV cache on the CPU (got {storage.k.dtype} on {device.type})"
        mods = SUPPORTS["modules"]
        if type(model) is not mods["model"] or type(model.config) is not mods["config"]:
            return f"written for model/llama.py's Llama, not {type(model).__name__} ({type(model.config).__name__})"
        cfg = model.config
        unknown = sorted(f.name for f in dataclasses.fields(cfg) if f.name not in SUPPORTS["config_fields"])
        if unknown:
            return f"config fields it does not know: {unknown}"
        if cfg.model_type not in SUPPORTS["model_type"]:
            return f"model_type {cfg.model_type!r} is not one of {sorted(SUPPORTS['model_type'])}"
        if (scaling := (cfg.rope_scaling or {}).get("rope_type", "default")) not in SUPPORTS["rope_scaling"]:
            return f"rope scaling {scaling!r} is not one of {sorted(SUPPORTS['rope_scaling'])}"
        if quant_kernels.default_path() == "torch" or quant_kernels.extension() is None:
            return "the C++ extension is not built (or the torch kernel path is forced)"
        for i, block in enumerate(model.model.layers):
            attn, mlp = block.self_attn, block.mlp
            for name, m, want in (("block", block, "block"), ("self_attn", attn, "attention"), ("mlp", mlp, "mlp")):
                if type(m) is not mods[want]:
                    return f"layer {i}: {name} is {type(m).__name__}, not {mods[want].__name__}"
            if not (attn.fused and mlp.fused):
                return f"layer {i}: projections not fused (e.g. LoRA wrappers, which fuse_projections leaves)"
            qk = (attn.q_norm, attn.k_norm) if cfg.qk_norm else ()
            for norm in (block.input_layernorm, block.post_attention_layernorm, *qk):
                if type(norm) is not mods["norm"] or norm.weight.dtype != torch.float32:
                    return f"layer {i}: a norm that is not a float32 RMSNorm ({type(norm).__name__})"
            for layer in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                if _linear_parts(layer) is None:
                    return f"layer {i}: a linear layer it does not run ({type(layer).__name__})"
        return None

    @classmethod
    def build(cls, model: nn.Module, storage: KVStorage, device: torch.device) -> FusedStep | None:
        """The fused step for this model and cache, or None (the reason logged) where refusal() names one."""
        reason = cls.refusal(model, storage, device)
        if reason is not None:
            log.info("fused decode step off: %s", reason)
            return None
        cfg = model.config
        norms, kinds, parts = [], [], []
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            qk = (attn.q_norm, attn.k_norm) if cfg.qk_norm else ()  # Qwen3: per-head q/k norms
            norms += [norm.weight.detach() for norm in (block.input_layernorm, block.post_attention_layernorm, *qk)]
            for layer in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                kind, tensors = _linear_parts(layer)
                kinds.append(kind)
                parts += tensors
        dims = [cfg.n_layer, cfg.hidden_size, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.intermediate_size]
        path = quant_kernels.PATH_CODES[quant_kernels.default_path()]
        layers = quant_kernels.extension().FusedLayers(dims, cfg.rms_norm_eps, norms, kinds, parts, path)
        return cls(model, layers, storage)

    def accepts(self, n_tokens: int) -> bool:
        return n_tokens < kernels.GEMM_MIN_ROWS

    def take_loras(self, adapters) -> bool:
        """Hand the C++ the adapters' stacks of each layer's four fused projections if the resident set changed
        since; False (their steps then run the model's forward) where the stacks are not float32 on the CPU."""
        if self._loras == (id(adapters), adapters.version):
            return self._lora_refused is None
        stacks, self._lora_refused = [], None
        for block in self.model.model.layers:
            for layer in (block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.gate_up_proj,
                          block.mlp.down_proj):
                stack = getattr(layer, "stack", None)
                if stack is None:
                    stacks += [_EMPTY, _EMPTY]
                elif stack[0].dtype != torch.float32 or stack[0].device.type != "cpu":
                    self._lora_refused = f"LoRA stacks in {stack[0].dtype} on {stack[0].device.type}, not float32"
                else:
                    stacks += [t.contiguous() for t in stack]
        if self._lora_refused is None:
            self.layers.set_lora(stacks)
        else:
            log.info("fused decode step off for adapter rows: %s", self._lora_refused)
            self.layers.set_lora([])
        self._loras = (id(adapters), adapters.version)
        return self._lora_refused is None

    @torch.inference_mode()
    def run(self, ids: list[int], tables: list[list[int]], starts: list[int], lengths: list[int],
            index: list[int], slots: list[int] | None = None) -> torch.Tensor:
        """Row r feeds ids[sum(lengths[:r]):][:lengths[r]] at positions starts[r]... over block table tables[r];
        -> logits [len(index), V] at the packed positions `index`. slots[t]: packed token t's place in the
        adapters' stacks (-1: the base), after take_loras."""
        if max(s + n for s, n in zip(starts, lengths)) > self.max_positions:
            raise ValueError(f"a sequence exceeds max_position_embeddings={self.max_positions}")
        pos = [p for s, n in zip(starts, lengths) for p in range(s, s + n)]
        rows = [r for r, n in enumerate(lengths) for _ in range(n)]
        width = max(len(t) for t in tables)
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        x = self.model.model.embed_tokens(torch.tensor(ids))
        h = self.layers.step(x.float(), self.cos, self.sin, torch.tensor(pos), torch.tensor(rows), self.storage.k,
                             self.storage.v, padded, _EMPTY_LONG if slots is None else torch.tensor(slots))
        h = h.index_select(0, torch.tensor(index))
        return self.model.lm_head(self.model.model.norm(h)).float()
