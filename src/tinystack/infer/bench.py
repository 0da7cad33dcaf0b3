"""Measuring what the KV cache buys: greedy decode with the cache vs recomputing every token.

Without the cache, step t runs the model over all t tokens so far; with it, over
one token plus a read of the cached keys/values. Both paths must produce the
same tokens (greedy), which the measurement checks before it reports a speed-up.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tinystack.infer.kv_cache import KVCache
from tinystack.model.gpt import GPT
from tinystack.model.io import load_model


@torch.inference_mode()
def decode_with_cache(model: GPT, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    cache = KVCache.for_model(model.config, batch=1, max_len=prompt.size(1) + new_tokens,
                              dtype=next(model.parameters()).dtype, device=prompt.device)
    logits, _ = model(prompt, kv_cache=cache)
    out = []
    for i in range(new_tokens):
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if i + 1 < new_tokens:
            logits, _ = model(torch.tensor([[nxt]], device=prompt.device), kv_cache=cache,
                              start_pos=prompt.size(1) + i)
    return out


@torch.inference_mode()
def decode_recompute(model: GPT, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    seq = prompt
    out = []
    for _ in range(new_tokens):
        nxt = int(model(seq)[0][0, -1].argmax())
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]], device=seq.device)], dim=1)
    return out


def kv_cache_speedup(model: GPT | str | Path, *, prompt_tokens: int = 64, new_tokens: int = 64,
                     device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Time both decoders on one random prompt; return tokens/s of each and the speed-up."""
    if not isinstance(model, GPT):
        model = load_model(model, device=device)
    if prompt_tokens + new_tokens > model.config.block_size:
        raise ValueError(f"prompt_tokens + new_tokens = {prompt_tokens + new_tokens} exceeds the model's "
                         f"context of {model.config.block_size}")
    prompt = torch.randint(model.config.vocab_size, (1, prompt_tokens),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    decode_with_cache(model, prompt, 2)  # warm-up: first-call allocations are not what we measure
    timings, outputs = {}, {}
    for name, fn in (("kv_cache", decode_with_cache), ("recompute", decode_recompute)):
        t0 = time.perf_counter()
        outputs[name] = fn(model, prompt, new_tokens)
        timings[name] = time.perf_counter() - t0
    if outputs["kv_cache"] != outputs["recompute"]:
        raise AssertionError("KV-cache decode diverged from full recompute")
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "kv_cache_tokens_per_s": new_tokens / timings["kv_cache"],
        "recompute_tokens_per_s": new_tokens / timings["recompute"],
        "speedup": timings["recompute"] / timings["kv_cache"],
        "same_tokens": True,
    }
