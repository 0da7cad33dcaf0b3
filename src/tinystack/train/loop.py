"""The PyTorch training loop: token file in, trained GPT out.

    train.bin --random windows--> (x, y) [B, T] --GPT--> loss --backward--> clip --AdamW (lr from schedule)
       every eval_interval steps: val loss on fixed windows; every step: one JSON line in the training log

The learning-rate schedule is `tinystack.nn.schedule.lr_at`, the same function the
NumPy backend uses. Weight decay applies to matrices only (not biases, LayerNorm
gains or embeddings), the usual AdamW practice. A non-finite loss stops the run
with the step number rather than writing a broken model.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tinystack.config import TrainConfig
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.nn.schedule import lr_at


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step."""


@dataclass
class TrainResult:
    steps: int
    final_train_loss: float
    final_val_loss: float | None
    best_val_loss: float | None
    tokens_per_s: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def get_batch(tokens: np.ndarray, batch_size: int, block_size: int, gen: torch.Generator,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1] (next-token targets)."""
    if len(tokens) <= block_size:
        raise ValueError(f"token file has {len(tokens)} tokens; need more than block_size={block_size}")
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=gen).tolist()
    x = np.stack([tokens[i:i + block_size] for i in starts]).astype(np.int64)
    y = np.stack([tokens[i + 1:i + 1 + block_size] for i in starts]).astype(np.int64)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def make_optimizer(model: GPT, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # 2-D weights of Linear layers decay; biases, LayerNorm and embeddings (wte is tied to lm_head) do not
        (decay if p.dim() >= 2 and "wte" not in name and "wpe" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


@torch.no_grad()
def estimate_loss(model: GPT, tokens: np.ndarray, cfg: TrainConfig, device: torch.device) -> float:
    """Mean loss over `eval_iters` batches drawn with a fixed seed, so estimates are comparable."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(0)
    losses = [model(*get_batch(tokens, cfg.batch_size, model.config.block_size, gen, device))[1].item()
              for _ in range(cfg.eval_iters)]
    model.train(was_training)
    return float(np.mean(losses))


def train(model_cfg: GPTConfig, train_tokens: np.ndarray, val_tokens: np.ndarray | None, cfg: TrainConfig,
          *, device: str = "cpu", log_path: str | Path | None = None, progress: bool = True) -> tuple[GPT, TrainResult]:
    """Train a fresh GPT for `cfg.max_iters` steps; return it (in eval mode) and a summary."""
    dev = torch.device(device)
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg).to(dev)
    model.train()
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    log = open(log_path, "w", encoding="utf-8") if log_path else None
    T, B = model_cfg.block_size, cfg.batch_size
    val_loss = best_val = None
    loss_value = float("nan")
    t_start = time.perf_counter()
    bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeRemainingColumn(), disable=not progress, transient=False)
    try:
        with bar:
            task = bar.add_task("train", total=cfg.max_iters, info="")
            for step in range(cfg.max_iters):
                lr = lr_at(step, max_lr=cfg.learning_rate, min_lr=cfg.min_lr,
                           warmup_iters=cfg.warmup_iters, max_iters=cfg.max_iters)
                for group in opt.param_groups:
                    group["lr"] = lr
                x, y = get_batch(train_tokens, B, T, gen, dev)
                _, loss = model(x, y)
                loss_value = loss.item()
                if not math.isfinite(loss_value):
                    raise NonFiniteLossError(f"loss became {loss_value} at step {step}; stopping (no model written)")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
                opt.step()
                record: dict[str, Any] = {"step": step, "loss": round(loss_value, 5), "lr": lr,
                                          "grad_norm": round(grad_norm, 4)}
                last = step == cfg.max_iters - 1
                if val_tokens is not None and ((step + 1) % cfg.eval_interval == 0 or last):
                    val_loss = estimate_loss(model, val_tokens, cfg, dev)
                    best_val = val_loss if best_val is None else min(best_val, val_loss)
                    record["val_loss"] = round(val_loss, 5)
                elapsed = time.perf_counter() - t_start
                record["tokens_per_s"] = round((step + 1) * B * T / elapsed, 1)
                if log:
                    log.write(json.dumps(record) + "\n")
                val_txt = f" val {val_loss:.3f}" if val_loss is not None else ""
                if "val_loss" in record and progress:  # a plain line too, so logs and CI output show progress
                    bar.console.print(f"step {step + 1}/{cfg.max_iters}: loss {loss_value:.3f}{val_txt}, "
                                      f"lr {lr:.2e}, {record['tokens_per_s']:,.0f} tokens/s")
                bar.update(task, advance=1, info=f"loss {loss_value:.3f}{val_txt} | {record['tokens_per_s']:,.0f} tok/s")
    finally:
        if log:
            log.close()
    wall = time.perf_counter() - t_start
    model.eval()
    return model, TrainResult(cfg.max_iters, loss_value, val_loss, best_val, cfg.max_iters * B * T / wall, wall)
