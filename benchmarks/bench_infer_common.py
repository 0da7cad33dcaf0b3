"""Shared by the inference benchmarks: the GPT-2-124M-shaped random model (ours and the same
weights in `transformers`), a tokenizer stand-in for token-id prompts, and the machine's load."""
from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"


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


def machine() -> dict:
    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "loadavg_at_start": os.getloadavg(),
            # PyTorch's allocator asks for 2 MiB pages for every tensor when this is set (see BENCHMARKS.md)
            "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE")}


def finish(res: dict) -> dict:
    res.setdefault("machine", {})["loadavg_at_end"] = os.getloadavg()
    return res


def timed(fn):
    """(seconds, result) where seconds is this process's CPU time, not wall time.

    The machine is shared: other engineers' jobs take cores away at random moments, which
    changes wall time by 2-5x between back-to-back runs. With one torch thread, CPU time
    counts only the work this process did (memory-bandwidth contention still shows), so
    ratios between systems measured in one run stay meaningful. Wall time is kept in
    `timed.last_wall` for the record."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    timed.last_wall = time.perf_counter() - w0
    return time.process_time() - c0, out


timed.last_wall = 0.0


def random_prompt(n: int, seed: int, vocab: int = 50257) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
