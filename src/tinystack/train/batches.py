"""Training batches: random next-token windows from a (memory-mapped) token array, seeded and resumable.

    tokens [N] --start offsets from a torch.Generator--> x = tokens[i:i+T], y = tokens[i+1:i+T+1]

One generator draws the GLOBAL batch of every step (all micro-batches of all ranks);
a rank takes its own slice. So one step of 2 DDP ranks x B windows, or of 4
accumulated micro-batches of 8, sees exactly the windows one process with one big
batch would see, and the data position is just (generator state, windows drawn):
saved in a checkpoint, it makes `--resume` continue on the very next window.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _windows(tokens: np.ndarray, starts: list[int], block_size: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.stack([tokens[i:i + block_size] for i in starts]).astype(np.int64)
    y = np.stack([tokens[i + 1:i + 1 + block_size] for i in starts]).astype(np.int64)
    return x, y


def _check(tokens: np.ndarray, block_size: int) -> None:
    if len(tokens) <= block_size:
        raise ValueError(f"token file has {len(tokens)} tokens; need more than block_size={block_size}")


def get_batch(tokens: np.ndarray, batch_size: int, block_size: int, gen: torch.Generator,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows as int64 tensors on `device`: x [B, T] and its next tokens y."""
    _check(tokens, block_size)
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=gen).tolist()
    x, y = _windows(tokens, starts, block_size)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


class BatchSampler:
    """Draws global batches of windows from one seeded generator; `state_dict` is the data position."""

    def __init__(self, tokens: np.ndarray, block_size: int, seed: int) -> None:
        _check(tokens, block_size)
        self.tokens, self.block_size = tokens, block_size
        self.gen = torch.Generator().manual_seed(seed)
        self.windows_drawn = 0

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n windows: x, y int64 [n, T] (NumPy; the caller slices its share and moves it to a device)."""
        starts = torch.randint(len(self.tokens) - self.block_size, (n,), generator=self.gen).tolist()
        self.windows_drawn += n
        return _windows(self.tokens, starts, self.block_size)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.gen.get_state(), "windows_drawn": self.windows_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["generator"])
        self.windows_drawn = int(state["windows_drawn"])

