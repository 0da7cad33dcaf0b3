"""The single-request engine: prompt text -> KV-cached generation -> text (the server's contract).

    encode prompt -> prefill (one forward over the whole prompt, filling the cache)
                  -> decode loop (one token per forward, reading the cache)
                  -> stop at EOS, max_tokens, the context limit, or cancellation

One request at a time per call, batch 1, with its own contiguous cache; the server
runs several calls on worker threads (torch releases the GIL in its kernels). Batched
serving (paged cache, continuous batching) is `LLMEngine` / `AsyncEngine`; this class
stays as the simple blocking contract `tinystack.serve` uses today:
`generate(prompt, params, cancel=Event, on_token=fn) -> Generation`, `encode_prompt`,
`max_seq_len`, PromptTooLongError. Sampling is the engine's (`sample_batch`: every
SamplingParams knob but stop strings, which LLMEngine handles).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tinystack.infer.kv_cache import KVCache
from tinystack.infer.llm_engine import PromptTooLongError
from tinystack.infer.sampler import SampleRow, SamplingParams, sample_batch
from tinystack.infer.weight_arena import place_weights
from tinystack.model.io import load_model

__all__ = ["Engine", "Generation", "PromptTooLongError"]


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS) | "length" (max_tokens or context full) | "cancelled"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    extra: dict = field(default_factory=dict)


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer, device: str | torch.device = "cpu"):
        """`tokenizer`: anything with encode_ordinary / decode / eos_token_id (BPETokenizer, infer.tokenizer)."""
        self.model = model.to(device).eval()
        place_weights(self.model)  # 2 MiB pages, column-major head: the same fast decode as LLMEngine
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_seq_len = model.config.max_seq_len

    @classmethod
    def from_dir(cls, model_dir: str | Path, device: str = "cpu") -> "Engine":
        from tinystack.infer.tokenizer import load_tokenizer

        return cls(load_model(model_dir, device=device), load_tokenizer(model_dir), device)

    def encode_prompt(self, prompt: str) -> list[int]:
        """Prompt text -> ids; special-token text in a prompt is treated as plain text."""
        ids = self.tokenizer.encode_ordinary(prompt)
        if not ids:  # an empty prompt starts from the document separator, as in training
            ids = [self.tokenizer.eos_token_id]
        if len(ids) >= self.max_seq_len:
            raise PromptTooLongError(
                f"prompt is {len(ids)} tokens; the model's context is {self.max_seq_len} tokens, "
                f"so a prompt may be at most {self.max_seq_len - 1} tokens")
        return ids

    @torch.inference_mode()
    def generate(self, prompt: str, params: SamplingParams, cancel: threading.Event | None = None,
                 on_token: Callable[[int], None] | None = None) -> Generation:
        ids = self.encode_prompt(prompt)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        budget = min(params.max_tokens, self.max_seq_len - len(ids))
        cache = KVCache.for_model(self.model.config, batch=1, max_len=len(ids) + budget,
                                  dtype=next(self.model.parameters()).dtype, device=self.device)

        t0 = time.perf_counter()
        logits, _ = self.model(torch.tensor([ids], device=self.device), kv_cache=cache, start_pos=0)
        t1 = time.perf_counter()
        out: list[int] = []
        finish = "length"
        while len(out) < budget:
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            nxt = sample_batch(logits[:, -1, :], [SampleRow(params, gen, ids, out)])[0][0]
            if (nxt == self.tokenizer.eos_token_id and not params.ignore_eos) or nxt in params.stop_token_ids:
                finish = "stop"
                break
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if len(out) == budget:
                break
            pos = len(ids) + len(out) - 1  # position of the token just produced
            logits, _ = self.model(torch.tensor([[nxt]], device=self.device), kv_cache=cache, start_pos=pos)
        t2 = time.perf_counter()
        return Generation(self.tokenizer.decode(out), out, len(ids), finish, prefill_s=t1 - t0, decode_s=t2 - t1)
