"""What training writes: the final model directory, and resumable training checkpoints.

`save_model_dir`: the directory is assembled in a temporary sibling and renamed into
place, so a crash mid-save leaves the previous model directory intact and a reader
never sees a half-written one.

`save_checkpoint` / `load_checkpoint`: one `torch.save` file (`last.pt`, `best.pt`)
holding model, optimiser, scheduler position, RNG states and data position,
written to a temp file and renamed, so the previous checkpoint survives a crash.
`training_state` assembles that dict for the loop (train/loop.py), `restore_training_state` puts it back on
`--resume`, and `open_log` cuts the training log back to the checkpoint's step.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tinystack.atomic import atomic_dir, atomic_open
from tinystack.config import TrainConfig
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


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The checkpointed part of a model: its trainable parameters and its buffers (all of a full model)."""
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def training_state(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                   sampler: Any, device: torch.device, *, lr: float, val_loss: float | None,
                   final_val_loss: float | None, best_val_loss: float | None, cfg: TrainConfig) -> dict[str, Any]:
    """What a checkpoint holds after `step` steps: trainable tensors, optimiser, scaler, schedule position, data
    position (`sampler.state_dict()`), RNG states, the validation losses so far and both configs."""
    return {"step": step, "model": trainable_state(model), "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict(), "scheduler": {"step": step, "last_lr": lr},
            "data": sampler.state_dict(), "rng": _rng_state(device), "val_loss": val_loss,
            "final_val_loss": final_val_loss,
            "best_val_loss": best_val_loss, "model_config": model.config.to_dict(),
            "train_config": asdict(cfg)}


def restore_training_state(ckpt: dict[str, Any], model: torch.nn.Module, opt: torch.optim.Optimizer,
                           scaler: torch.amp.GradScaler, sampler: Any, device: torch.device) -> None:
    """Put a `training_state` back: the trainable tensors (the frozen rest came from the model factory),
    optimiser, scaler, the data position (`sampler.load_state_dict`) and the RNG states."""
    expected = trainable_state(model)
    if set(ckpt["model"]) != set(expected):
        raise ValueError("--resume: the checkpoint's trainable tensors do not match this model "
                         f"({len(ckpt['model'])} saved, {len(expected)} expected; same LoRA settings?)")
    model.load_state_dict(ckpt["model"], strict=False)  # the frozen rest came from the model factory
    opt.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    sampler.load_state_dict(ckpt["data"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    if "cuda" in ckpt["rng"] and device.type == "cuda":
        torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)


def open_log(log_path: str | Path | None, start_step: int) -> Any:
    """A fresh log, or on resume the old one cut back to the steps before `start_step` (then appended to)."""
    if not log_path:
        return None
    path = Path(log_path)
    kept = []
    if start_step and path.is_file():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["step"] < start_step]
    with atomic_open(path) as f:
        f.write("".join(line + "\n" for line in kept))
    return open(path, "a", encoding="utf-8")
