"""What training writes: the final model directory, and resumable training checkpoints.

`save_model_dir`: the directory is assembled in a temporary sibling and renamed into
place, so a crash mid-save leaves the previous model directory intact and a reader
never sees a half-written one.

`save_checkpoint` / `load_checkpoint`: one `torch.save` file (`last.pt`, `best.pt`)
holding model, optimiser, scheduler position, RNG states and data position,
written to a temp file and renamed, so the previous checkpoint survives a crash.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tinystack.atomic import atomic_dir, atomic_open
from tinystack.model.gpt import GPT
from tinystack.model.io import save_model


def save_model_dir(model: GPT, tokenizer: Any, out_dir: str | Path, lineage: dict[str, Any]) -> Path:
    """Write model + tokenizer + lineage to `out_dir`, replacing any previous directory atomically."""
    with atomic_dir(out_dir) as tmp:
        save_model(model, tmp, eos_token_id=tokenizer.eos_token_id, lineage=lineage)
        tokenizer.save(tmp)
    return Path(out_dir)


# --- training checkpoints: everything `--resume` needs, one file each, written atomically ---------------

LAST, BEST = "last.pt", "best.pt"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """torch.save `state` to a temp file beside `path`, then rename: a crash keeps the previous file."""


    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    return Path(path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (tensors, numbers, strings and dicts only)."""

    return torch.load(path, map_location="cpu", weights_only=True)
