"""The memory budget: how many KV-cache blocks fit, printed at start-up, and admission.

    kv_blocks = (memory_limit * (1 - buffer) - weight_bytes - overhead) / bytes_per_block
    bytes_per_block = 2 (K, V) * n_layer * block_size * n_kv_head * head_dim * dtype bytes

`memory_limit` is [infer] memory_limit_mb, or by default the GPU's free memory on CUDA and
cpu_memory_fraction of the available RAM on CPU. `overhead` estimates the activations of the largest step (a
prefill chunk of max_num_batched_tokens: hidden states, MLP, attention scores) plus
the logits. Blocks are capped at what max_num_seqs full-length sequences can use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from tinystack.config import InferConfig
from tinystack.infer.paged_cache import KVStorage


class AdmissionError(ValueError):
    """A request can never fit in the KV cache; the message has the numbers."""


def available_memory(device: torch.device, cpu_fraction: float) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return int(info.get("MemAvailable", info["MemTotal"]) * cpu_fraction)


@dataclass
class MemoryBudget:
    memory_limit: int
    buffer: float
    weight_bytes: int
    overhead: int
    bytes_per_block: int
    block_size: int
    num_blocks: int
    max_seq_len: int
    max_concurrent_full_len: int  # sequences of max_seq_len that fit at once

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def describe(self) -> str:
        mib = lambda b: f"{b / 2**20:,.1f} MiB"
        return (f"memory budget: limit {mib(self.memory_limit)} x (1 - {self.buffer:g} buffer) - weights "
                f"{mib(self.weight_bytes)} - overhead {mib(self.overhead)} -> {self.num_blocks} KV blocks of "
                f"{self.block_size} tokens ({mib(self.bytes_per_block)} each, {mib(self.kv_bytes)} in all); "
                f"{self.max_concurrent_full_len} concurrent sequence{'s' * (self.max_concurrent_full_len != 1)} "
                f"at max_seq_len={self.max_seq_len}")

    def to_dict(self) -> dict:
        return asdict(self)

    def admit(self, prompt_tokens: int, max_new_tokens: int) -> None:
        need = -(-(prompt_tokens + max_new_tokens) // self.block_size)
        if need > self.num_blocks:
            raise AdmissionError(
                f"request needs {prompt_tokens} prompt + {max_new_tokens} new tokens = {need} KV blocks of "
                f"{self.block_size} tokens, but the whole cache has {self.num_blocks} blocks "
                f"({self.num_blocks * self.block_size} tokens, memory limit {self.memory_limit / 2**20:,.1f} MiB)")


def plan_memory(model: torch.nn.Module, config: InferConfig, *, device: torch.device, dtype: torch.dtype,
                block_size: int) -> MemoryBudget:
    """The budget for this model under [infer]'s limits (memory_limit_mb, memory_buffer, cpu_memory_fraction,
    max_num_seqs, max_num_batched_tokens; num_kv_blocks caps the block count) with KV blocks of `block_size`
    tokens (the engine's: kv_block_size, or the whole context for a contiguous cache)."""
    cfg = model.config
    buffer, max_num_batched_tokens = config.memory_buffer, config.max_num_batched_tokens
    limit = config.memory_limit_mb * 2**20 or available_memory(device, config.cpu_memory_fraction)
    weights = getattr(model, "weight_bytes", None)
    if weights is None:  # tied parameters counted once; int8 weights live in buffers
        weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
        weights += sum(b.numel() * b.element_size() for b in model.buffers())
    hidden = getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0))
    inter = getattr(cfg, "intermediate_size", 4 * hidden)
    n_head = cfg.n_head
    elt = torch.empty((), dtype=dtype).element_size()
    overhead = (max_num_batched_tokens * (8 * hidden + 3 * inter) * elt  # hidden states, MLP activations
                + max_num_batched_tokens * cfg.max_seq_len * n_head * 4  # one layer's attention scores (fp32)
                + config.max_num_seqs * cfg.vocab_size * 4)  # logits
    per_block = KVStorage.bytes_per_block(cfg.n_layer, block_size, cfg.n_kv_head, cfg.head_dim, dtype)
    usable = limit * (1 - buffer) - weights - overhead
    blocks_per_seq = -(-cfg.max_seq_len // block_size)
    num_blocks = min(int(usable // per_block), config.max_num_seqs * blocks_per_seq, config.num_kv_blocks or 2**62)
    if num_blocks < 1:
        raise AdmissionError(f"no room for a single KV block: limit {limit / 2**20:,.1f} MiB x (1 - {buffer:g}) - "
                             f"weights {weights / 2**20:,.1f} MiB - overhead {overhead / 2**20:,.1f} MiB < "
                             f"{per_block / 2**20:,.2f} MiB per block")
    return MemoryBudget(limit, buffer, weights, overhead, per_block, block_size, num_blocks, cfg.max_seq_len,
                        num_blocks // blocks_per_seq)
