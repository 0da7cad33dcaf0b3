"""Measuring what the KV cache buys: the engine's decode with its cache vs recomputing every token.

Both sides run the one engine (LLMEngine, one greedy request, no decode loop of their own):

    kv_cache   kv_cache="contiguous": each step feeds the one new token and attends over the
               keys/values cached so far
    recompute  the same model behind `Recompute`, which has no cache: each step the model runs
               over the whole sequence so far (the ModelRunner's `needs_full_sequence` path,
               the one the NumPy backend takes); only the last position goes through the
               output head, as in the engine's own steps, so the baseline is not handicapped

Both must produce the same tokens (greedy), which the measurement checks before it
reports a speed-up.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from tinystack.config import InferConfig
from tinystack.infer.llm_engine import LLMEngine
from tinystack.model.io import load_model
from tinystack.sampling_params import SamplingParams


class Recompute(torch.nn.Module):
    """`model` without a KV cache: the engine asks it for the last position's logits of a whole sequence."""

    needs_full_sequence = True

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner, self.config = model, model.config
        # the engine places weights once per model (weight_arena.py); these are the inner model's
        self._weight_arena = getattr(model, "_weight_arena", None)

    def last_logits(self, token_ids: list[int]) -> torch.Tensor:
        device = next(self.inner.parameters()).device
        ids = torch.tensor([token_ids], device=device)
        logits, _ = self.inner(ids, logit_index=torch.tensor([len(token_ids) - 1], device=device))
        return logits[0, -1]


def _run(engine: LLMEngine, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Generate greedily on `engine`; (token ids, wall seconds)."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request(None, prompt, params)
    out = None
    while engine.has_unfinished():
        for d in engine.step():
            out = d.output or out
    return out.token_ids, time.perf_counter() - t0


def kv_cache_speedup(model: torch.nn.Module | str | Path, *, prompt_tokens: int = 64, new_tokens: int = 64,
                     device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Time both on one random prompt; tokens/s of each and the speed-up. Raises ValueError if the prompt
    and the new tokens do not fit the model's context, AssertionError if the two decodes disagree."""
    if isinstance(model, (str, Path)):
        model = load_model(model, device=device)
    model.eval()
    cfg = model.config
    if prompt_tokens < 1 or prompt_tokens + new_tokens > cfg.max_seq_len:
        raise ValueError(f"prompt_tokens + new_tokens = {prompt_tokens + new_tokens} exceeds the model's "
                         f"context of {cfg.max_seq_len} (and prompt_tokens must be >= 1)")
    prompt = torch.randint(cfg.vocab_size, (prompt_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()
    config = InferConfig(max_num_seqs=1, max_num_batched_tokens=max(prompt_tokens, 1))
    # the tokenizer is never used: prompts are ids, greedy ignores EOS, no text is streamed
    cached = LLMEngine(model, _NoText(), dataclasses.replace(config, kv_cache="contiguous"))
    recompute = LLMEngine(Recompute(model), _NoText(), config)
    for engine in (cached, recompute):  # warm-up: first-call allocations are not what we measure
        _run(engine, prompt[:8], 2)
    (kv_ids, kv_s), (re_ids, re_s) = _run(cached, prompt, new_tokens), _run(recompute, prompt, new_tokens)
    if kv_ids != re_ids:
        raise AssertionError("KV-cache decode diverged from full recompute")
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "kv_cache_tokens_per_s": new_tokens / kv_s,
        "recompute_tokens_per_s": new_tokens / re_s,
        "speedup": re_s / kv_s,
        "same_tokens": True,
    }


class _NoText:
    """The engine's tokenizer slot for id-only runs: no EOS (ignore_eos), decoding gives no text."""

    eos_token_id = None
    eos_token_ids = frozenset()

    def decode(self, ids: list[int]) -> str:
        return ""
