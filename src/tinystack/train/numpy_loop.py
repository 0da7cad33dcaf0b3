"""The NumPy backend of `tinystack train`: the PyTorch loop's steps on `tinystack.nn`'s GPT.

Same seed -> same initial weights (a PyTorch GPT is built with the seed and copied over),
same batches (`batches.BatchSampler`), same schedule (`lr_at`), same AdamW parameter
groups, same clipping; only the forward and backward differ (hand-written here). So in
float64 the two backends' losses agree step for step (tested within 1e-5 over 10 steps).
No checkpoints/resume, DDP or mixed precision: this backend exists to be read and checked.
Validation as the PyTorch loop's: estimates on the same fixed windows (scored here in NumPy), and the final
val loss by eval.scoring on a PyTorch copy of the weights, on eval's own windows (= `tinystack eval`'s).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tinystack.atomic import atomic_open
from tinystack.config import EvalConfig, TrainConfig
from tinystack.eval.scoring import score_batches, window_batches
from tinystack.model.gpt import GPT as TorchGPT
from tinystack.model.gpt import GPTConfig
from tinystack.nn.gpt import GPT
from tinystack.nn.gpt_io import from_torch, to_torch
from tinystack.nn.loss import softmax_cross_entropy
from tinystack.nn.optim import AdamW, clip_grad_norm
from tinystack.nn.schedule import lr_at
from tinystack.train.batches import BatchSampler
from tinystack.train.loop import NonFiniteLossError, TrainResult

_NP_DTYPES = {"float32": np.float32, "float64": np.float64, "auto": np.float32}  # auto: NumPy has no bf16


def init_numpy_gpt(model_cfg: GPTConfig, seed: int, dtype: Any = np.float32) -> GPT:
    """The NumPy GPT with exactly the initial weights the PyTorch loop starts from for this seed."""
    torch.manual_seed(seed)
    return from_torch(TorchGPT(model_cfg), dtype)


def estimate_loss_numpy(model: GPT, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean loss per target over fixed window batches (every target scored), in NumPy."""
    model.eval()
    nats = sum(model.loss(x, y) * y.size for x, y in batches)
    model.train()
    return float(nats / sum(y.size for _, y in batches))


def train_numpy(model_cfg: GPTConfig, train_tokens: np.ndarray, val_tokens: np.ndarray | None, cfg: TrainConfig,
                *, log_path: str | Path | None = None, progress: bool = True,
                eval_cfg: EvalConfig | None = None) -> tuple[GPT, TrainResult]:
    """Train the NumPy GPT for `cfg.max_iters` steps; returns it (eval mode) and the same summary as `loop.train`
    (validation on the same windows: estimates on eval_iters batches, the final on eval_cfg's)."""
    if cfg.dtype not in _NP_DTYPES:
        raise ValueError(f"the numpy backend supports train.dtype float32 or float64, got {cfg.dtype!r}")
    model = init_numpy_gpt(model_cfg, cfg.seed, _NP_DTYPES[cfg.dtype]).train()
    params, grads = model.parameters(), model.gradients()
    no_decay = {n for n, p in params.items() if p.ndim < 2 or "wte" in n or "wpe" in n}  # as optimizer.make_optimizer
    opt = AdamW(params, grads, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=1e-8,
                weight_decay=cfg.weight_decay, no_decay=no_decay)
    sampler = BatchSampler(train_tokens, model_cfg.block_size, cfg.seed)
    B, T, A = cfg.batch_size, model_cfg.block_size, cfg.grad_accum_steps
    if val_tokens is not None:
        ev = eval_cfg or EvalConfig()
        val = window_batches(val_tokens, T, cfg.eval_iters * B, B)
        final = window_batches(val_tokens, T, ev.max_windows, ev.windows_per_batch)
    log = None
    if log_path:
        with atomic_open(log_path) as f:  # create it empty, atomically; then stream lines into it
            f.write("")
        log = open(log_path, "a", encoding="utf-8")
    val_loss = best_val = None
    loss_value = float("nan")
    t_start = time.perf_counter()
    bar = Progress(TextColumn("train[numpy]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeRemainingColumn(), disable=not progress, transient=False)
    try:
        with bar:
            task = bar.add_task("train", total=cfg.max_iters, info="")
            for step in range(cfg.max_iters):
                lr = lr_at(step, max_lr=cfg.learning_rate, min_lr=cfg.min_lr,
                           warmup_iters=cfg.warmup_iters, max_iters=cfg.max_iters)
                x_all, y_all = sampler.sample(B * A)
                model.zero_grad()
                total = 0.0
                for micro in range(A):
                    rows = slice(micro * B, (micro + 1) * B)
                    loss, dlogits = softmax_cross_entropy(model.forward(x_all[rows]), y_all[rows])
                    model.backward(dlogits / A)  # gradients add up across micro-batches: the big batch's mean
                    total += loss
                loss_value = total / A
                if not np.isfinite(loss_value):
                    raise NonFiniteLossError(f"loss became {loss_value} at step {step}; stopping")
                grad_norm = clip_grad_norm(grads, cfg.grad_clip)
                opt.step(lr)
                record: dict[str, Any] = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": round(grad_norm, 4)}
                if val_tokens is not None and ((step + 1) % cfg.eval_interval == 0 or step == cfg.max_iters - 1):
                    val_loss = estimate_loss_numpy(model, val)
                    best_val = val_loss if best_val is None else min(best_val, val_loss)
                    record["val_loss"] = val_loss
                if val_tokens is not None and step == cfg.max_iters - 1:
                    val_loss = record["final_val_loss"] = score_batches(to_torch(model.eval()), final).loss
                record["tokens_per_s"] = round((step + 1) * B * A * T / (time.perf_counter() - t_start), 1)
                if log:
                    log.write(json.dumps(record) + "\n")
                val_txt = f" val {val_loss:.3f}" if val_loss is not None else ""
                tps = record["tokens_per_s"]
                bar.update(task, advance=1, info=f"loss {loss_value:.3f}{val_txt} | {tps:,.0f} tok/s")
    finally:
        if log:
            log.close()
    wall = time.perf_counter() - t_start
    model.eval()
    return model, TrainResult(cfg.max_iters, loss_value, val_loss, best_val, cfg.max_iters * B * A * T / wall, wall)
