"""Shared by the inference benchmarks: the GPT-2-124M-shaped random model (ours and the same
weights in `transformers`), a tokenizer stand-in for token-id prompts, and the machine's load."""
from __future__ import annotations

import tempfile

import torch

from bench_common import RESULTS, ROOT  # noqa: F401  (re-exported for the inference benchmarks)


class IdTokenizer:
    """Prompts are token ids already; text is not what these benchmarks measure."""

    eos_token_id = 50256
    eos_token_ids = frozenset({50256})

    def encode_ordinary(self, text: str) -> list[int]:
        raise TypeError("benchmarks pass token ids")

    def decode(self, ids) -> str:
        return ""


def gpt2_124m(block_size: int = 1024, seed: int = 0, n_layer: int = 12):
    """(our GPT, HF GPT2LMHeadModel) with identical random weights: 12 x 768, 12 heads, vocab 50257, float32.

    block_size > 1024 only where a benchmark needs prompt + new tokens past GPT-2's 1,024 positions."""
    import transformers

    from tinystack.model import load_model

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_positions=block_size, n_embd=768, n_layer=n_layer, n_head=12, vocab_size=50257,
                                  eos_token_id=None, bos_token_id=None)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        ours = load_model(d)
    return ours, hf


def random_prompt(n: int, seed: int, vocab: int = 50257) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
