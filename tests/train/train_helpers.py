"""Shared by the training tests: a small learnable token stream, a fast config, LoRA's two paths under bf16."""
import numpy as np
import torch

from tinystack.config import TrainConfig
from tinystack.model import GPTConfig

TINY = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)


def tokens(n=4000, vocab=16, seed=0):
    """A fixed random permutation cycle with 10% noise tokens."""
    rng = np.random.default_rng(seed)
    seq = np.tile(rng.permutation(vocab), n // vocab + 1)[:n]
    noise = rng.random(n) < 0.1
    seq[noise] = rng.integers(0, vocab, noise.sum())
    return seq.astype(np.uint16)


def cfg(**kw):
    base = dict(max_iters=20, batch_size=4, learning_rate=1e-2, min_lr=1e-3, warmup_iters=3,
                eval_interval=5, eval_iters=2, seed=0, plot=False)
    return TrainConfig(**{**base, **kw})


def lora_bf16_paths(lora, x, g):
    """A LoRALinear's output and gradients (x, A, B) under bf16 autocast, through its hand-written product and
    through autograd's plain graph of the same layer (a Dropout(0) module sends it there): two tuples."""
    outs = []
    for path in ("hand", "autograd"):
        lora.dropout = torch.nn.Identity() if path == "hand" else torch.nn.Dropout(0.0)
        x.grad = lora.lora_A.grad = lora.lora_B.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lora(x)
        y.backward(g.to(y.dtype))
        assert y.dtype == torch.bfloat16 and x.grad.dtype == lora.lora_A.grad.dtype == torch.float32
        outs.append((y.detach().float(), x.grad, lora.lora_A.grad, lora.lora_B.grad))
    lora.dropout = torch.nn.Identity()
    return outs
