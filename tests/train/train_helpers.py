"""Shared by the training tests: a small learnable token stream and a fast config."""
import numpy as np

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
