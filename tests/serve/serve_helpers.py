"""Helpers shared by the serving tests (a uniquely named module: every test folder has a conftest.py)."""
import random
import time

import torch

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine, LLMEngine
from tinystack.model import GPT, GPTConfig
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.tokenizer import BPETokenizer

PROMPT = "return the number of"


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def unbatched(model: torch.nn.Module, tokenizer: BPETokenizer) -> AsyncEngine:
    """The engine serving one sequence at a time (batching "none": max_num_seqs=1)."""
    return AsyncEngine(LLMEngine(model, tokenizer, InferConfig(max_num_seqs=1, num_kv_blocks=16)))


def tiny_gpt(tokenizer: BPETokenizer) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=32))


class FaultyModel(torch.nn.Module):
    """Wraps a GPT: each forward pass (= one engine step) first sleeps `delay_s`, then raises
    with probability `fail_rate` (seeded), or always while `failing` is set. Fault injection
    at the engine's step level, under the real server."""

    def __init__(self, inner: GPT, delay_s: float = 0.0, fail_rate: float = 0.0, seed: int = 0):
        super().__init__()
        self.inner, self.config = inner, inner.config
        self.delay_s, self.fail_rate, self.failing = delay_s, fail_rate, False
        self.rng = random.Random(seed)
        self.steps = 0

    def forward(self, *args, **kwargs):
        self.steps += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.failing or (self.fail_rate and self.rng.random() < self.fail_rate):
            raise RuntimeError("injected engine fault (secret internal detail)")
        return self.inner(*args, **kwargs)


def random_lora(base: torch.nn.Module, targets: tuple[str, ...], seed: int, rank: int = 4) -> LoRAAdapter:
    """A LoRA adapter with random A and B on the modules of `base` named in `targets` (GPT-2's c_attn, ...)."""
    g = torch.Generator().manual_seed(seed)
    weights = {path: (torch.randn(rank, m.weight.shape[1], generator=g) * 0.5,
                      torch.randn(m.weight.shape[0], rank, generator=g) * 0.5)
               for path, m in base.named_modules() if path.rsplit(".", 1)[-1] in targets and hasattr(m, "weight")}
    return LoRAAdapter(weights, rank, 2.0)
