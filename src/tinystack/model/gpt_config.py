"""`GPTConfig`: the GPT-2 architecture's shape, without torch.

Its own module so the NumPy backend (tinystack.nn) shares the exact config the PyTorch GPT uses
while importing no torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 128  # max positions (GPT-2's n_positions)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # the shape facts the inference engine needs, named the same for every model family
    @property
    def n_kv_head(self) -> int:
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def max_seq_len(self) -> int:
        return self.block_size
