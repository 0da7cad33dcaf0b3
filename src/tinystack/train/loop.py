"""The PyTorch training loop: token file in, trained GPT out; resumable, mixed precision, DDP-aware.

`train` pretrains a GPT on a token array; `train_model` is the same loop over any model
factory and batch source (fine-tuning: a pretrained model, maybe with LoRA adapters, and
padded conversations whose non-assistant targets are IGNORE_INDEX; train.finetune).

    each step:  lr = nn.schedule.lr_at(step)
                global batch from the batch source -> this rank's slice -> grad_accum_steps micro-batches
                    (trailing columns with no target left in a micro-batch are cut: causal attention
                     means they change nothing before them)
                    autocast forward -> loss / accum -> (scaled) backward   (DDP syncs on the last micro-batch)
                non-finite loss or gradient -> NonFiniteLossError naming the step (nothing is written)
                unscale -> clip by global norm -> AdamW step
    every eval_interval steps: val_loss, an estimate on a fixed subset of batches (eval.scoring.score_batches,
                               in the training precision; it picks best.pt, keep_best's weights, and
                               early_stopping ends the run after that many evaluations without a better one)
    at the last step: final_val_loss, the same function on eval's own windows in the model's precision:
                      the number `tinystack eval` reports for this checkpoint and split
    every step: one JSON line in the training log
    every ckpt_interval steps (and at the end): ckpt_dir/last.pt, and best.pt when val loss improved
                                               (train.checkpoint: what they hold, how a resume restores it)

`resume=True` restores model, optimiser, scaler, step, RNG and data position from
ckpt_dir/last.pt, so N steps + resume + M steps equals N + M steps bit for bit.
Checkpoints hold the trainable parameters and buffers only: a frozen base is rebuilt by
the model factory (a LoRA checkpoint is the adapters, not the whole model).
Only parameters with requires_grad reach the optimiser. Weight decay applies to
matrices only (not biases, norm gains or embeddings).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tinystack.config import EvalConfig, TrainConfig
from tinystack.errors import UserError
from tinystack.eval.scoring import score_batches, window_batches
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.nn.schedule import lr_at
from tinystack.progress import console
from tinystack.train import precision
from tinystack.train.allocator import keep_freed_memory
from tinystack.train.batches import BatchSampler, get_batch
from tinystack.train.checkpoint import (
    BEST,
    LAST,
    load_checkpoint,
    open_log,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from tinystack.train.distributed import DistInfo, init_distributed, mean_across_ranks
from tinystack.train.loss import next_token_loss, trim_targets
from tinystack.train.optimizer import make_optimizer

REFRESH_S = 1.0  # the progress bar's redraw interval (seconds)


class BatchSource(Protocol):
    """What the loop draws from: `sample(n)` -> x, y int64 [n, T] (y = IGNORE_INDEX where no loss),
    and a `state_dict` that is the data position (saved in checkpoints, restored on resume)."""

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class NonFiniteLossError(UserError, RuntimeError):
    """The loss (or gradient norm) became NaN or infinite; the message names the step. A UserError: the run
    diverged under its settings (usually the learning rate), so the CLI reports it in one line."""


DIVERGED = "the last checkpoint is kept; a lower train.learning_rate usually helps"


@dataclass
class TrainResult:
    steps: int
    final_train_loss: float
    final_val_loss: float | None  # the last validation (pretraining: eval's windows, = `tinystack eval`'s loss)
    best_val_loss: float | None  # the best periodic estimate
    tokens_per_s: float
    wall_s: float
    resumed_from: int = 0  # the step training resumed at (0: a fresh run)
    dtype: str = ""  # the precision trained in (train.dtype, or what `auto` measured and chose)
    precision_probe: dict[str, Any] | None = None  # auto: the measurements behind the choice
    stopped_early: bool = False  # train.early_stopping ended the run before max_iters
    best_step: int | None = None  # train.keep_best: the step whose weights the model ends with

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["BatchSource", "NonFiniteLossError", "TrainResult", "get_batch", "make_optimizer", "train", "train_model"]


def train(model_cfg: GPTConfig, train_tokens: np.ndarray, val_tokens: np.ndarray | None, cfg: TrainConfig,
          *, device: str = "cpu", log_path: str | Path | None = None, progress: bool = True,
          ckpt_dir: str | Path | None = None, resume: bool = False,
          eval_cfg: EvalConfig | None = None) -> tuple[GPT, TrainResult]:
    """Train a GPT for `cfg.max_iters` steps (from ckpt_dir/last.pt if `resume`); return it in eval mode
    and a summary. Under torchrun every rank returns the same model; only rank 0 writes files.
    Validation: estimates on eval_iters batches of evenly spaced val windows; the final one on the windows
    `tinystack eval` scores under `eval_cfg` ([eval] max_windows, windows_per_batch), so the two numbers agree."""
    val = final = None
    if val_tokens is not None:
        T, ev = model_cfg.block_size, eval_cfg or EvalConfig()
        val = window_batches(val_tokens, T, cfg.eval_iters * cfg.batch_size, cfg.batch_size)
        final = window_batches(val_tokens, T, ev.max_windows, ev.windows_per_batch)
    return train_model(lambda: GPT(model_cfg), BatchSampler(train_tokens, model_cfg.block_size, cfg.seed), val, cfg,
                       device=device, log_path=log_path, progress=progress, ckpt_dir=ckpt_dir, resume=resume,
                       final_val_batches=final)


def train_model(build_model: Callable[[], torch.nn.Module], sampler: BatchSource,
                val_batches: Sequence[tuple[np.ndarray, np.ndarray]] | None, cfg: TrainConfig, *, device: str = "cpu",
                log_path: str | Path | None = None, progress: bool = True, ckpt_dir: str | Path | None = None,
                resume: bool = False, label: str = "train",
                final_val_batches: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[Any, TrainResult]:
    """The loop of `train` for any model: `build_model()` (called once, after seeding with cfg.seed, so
    random inits such as LoRA's repeat) returns it with the parameters to train marked requires_grad;
    `sampler` yields the batches; `val_batches` are scored (eval.scoring.score_batches, in the training
    precision) every eval_interval steps; `final_val_batches`, if given, once at the end in the model's own
    precision: that is the result's final_val_loss (else the last val_loss is)."""
    info, device = init_distributed(device)
    if cfg.keep_freed_memory:
        keep_freed_memory()
    dev = torch.device(device)
    precision.check_dtype(cfg.dtype, dev.type)
    torch.manual_seed(cfg.seed)
    model = build_model().to(dev)
    if cfg.dtype == "float64":
        model = model.double()
    model.train()
    opt = make_optimizer(model, cfg)
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else None
    start, best_val, val_loss, final_val, ckpt, probe = 0, None, None, None, None, None
    best_state, best_step, stale, stopped = None, None, 0, False  # keep_best's weights; evals since a better one
    if resume:
        if ckpt_dir is None or not (ckpt_dir / LAST).is_file():
            raise FileNotFoundError(f"--resume: no checkpoint {ckpt_dir and ckpt_dir / LAST}")
        ckpt = load_checkpoint(ckpt_dir / LAST)
    if cfg.dtype == "auto":  # a resume keeps the precision the run chose (its checkpoint's train_config)
        if ckpt:
            dtype = ckpt["train_config"]["dtype"]
        else:
            dtype, probe = _probe_precision(model, sampler, cfg, info, dev)
            if progress and info.is_main:
                console.print(precision.describe(probe))
        cfg = replace(cfg, dtype=dtype)
    scaler = precision.grad_scaler(cfg.dtype, dev.type)
    if ckpt:
        restore_training_state(ckpt, model, opt, scaler, sampler, dev)
        start, best_val, val_loss = ckpt["step"], ckpt["best_val_loss"], ckpt["val_loss"]
        final_val = ckpt.get("final_val_loss")
    fwd: torch.nn.Module = torch.compile(model) if cfg.compile else model
    if info.enabled:
        fwd = torch.nn.parallel.DistributedDataParallel(fwd, device_ids=[dev.index] if dev.type == "cuda" else None)
    log = open_log(log_path, start) if info.is_main else None
    tokens_done = 0  # positions fed to the model since start (all ranks): the work, padding included
    loss_value = float("nan")
    t_start = time.perf_counter()
    # no auto-refresh thread: rich redraws 10 times a second on a thread of its own, which preempts torch's
    # compute threads at random; the loop redraws itself between steps, at most once every REFRESH_S
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeRemainingColumn(), disable=not (progress and info.is_main), transient=False, auto_refresh=False)
    last_redraw = 0.0  # seconds since t_start
    try:
        with bar:
            task = bar.add_task(label, total=cfg.max_iters, completed=start, info="")
            for step in range(start, cfg.max_iters):
                lr = lr_at(step, max_lr=cfg.learning_rate, min_lr=cfg.min_lr,
                           warmup_iters=cfg.warmup_iters, max_iters=cfg.max_iters)
                for group in opt.param_groups:
                    group["lr"] = lr
                loss_value, grad_norm, n_tokens = _step(fwd, opt, scaler, sampler, cfg, info, dev, step)
                tokens_done += n_tokens
                record: dict[str, Any] = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": round(grad_norm, 4)}
                last = step == cfg.max_iters - 1
                improved = False
                if val_batches and ((step + 1) % cfg.eval_interval == 0 or last):
                    with precision.autocast(cfg.dtype, dev.type):
                        val_loss = score_batches(model, val_batches, device=dev).loss
                    improved = best_val is None or val_loss < best_val
                    best_val = val_loss if improved else best_val
                    record["val_loss"] = val_loss
                    stale = 0 if improved else stale + 1
                    if improved and cfg.keep_best:
                        best_state, best_step = _trainable(model, clone=True), step + 1
                    if cfg.early_stopping and stale >= cfg.early_stopping and not last:
                        last = stopped = record["early_stop"] = True
                if last and final_val_batches:  # no autocast: the weights as saved, scored as `tinystack eval` does
                    final_val = record["final_val_loss"] = score_batches(model, final_val_batches, device=dev).loss
                elapsed = time.perf_counter() - t_start
                record["tokens_per_s"] = round(tokens_done / elapsed, 1)
                if log:  # before the checkpoint: a resume keeps every line up to the checkpoint's step
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                save_last = last or (cfg.ckpt_interval > 0 and (step + 1) % cfg.ckpt_interval == 0)
                if ckpt_dir is not None and info.is_main and (save_last or improved):
                    state = training_state(step + 1, model, opt, scaler, sampler, dev, lr=lr, val_loss=val_loss,
                                           final_val_loss=final_val, best_val_loss=best_val, cfg=cfg)
                    if save_last:
                        save_checkpoint(ckpt_dir / LAST, state)
                    if improved:
                        save_checkpoint(ckpt_dir / BEST, state)
                val_txt = f" val {val_loss:.3f}" if val_loss is not None else ""
                if "val_loss" in record and progress and info.is_main:  # a plain line too, for logs and CI output
                    bar.console.print(f"step {step + 1}/{cfg.max_iters}: loss {loss_value:.3f}{val_txt}, "
                                      f"lr {lr:.2e}, {record['tokens_per_s']:,.0f} tokens/s")
                redraw = last or elapsed - last_redraw >= REFRESH_S
                last_redraw = elapsed if redraw else last_redraw
                tps = record["tokens_per_s"]
                bar.update(task, advance=1, info=f"loss {loss_value:.3f}{val_txt} | {tps:,.0f} tok/s", refresh=redraw)
                if stopped:
                    break
    finally:
        if log:
            log.close()
    wall = time.perf_counter() - t_start
    model.eval()
    if best_state is not None and stale:  # a later evaluation was worse: back to the best weights
        with torch.no_grad():
            for name, p in _trainable(model).items():
                p.copy_(best_state[name])
        val_loss = best_val
        if final_val_batches:
            final_val = score_batches(model, final_val_batches, device=dev).loss
    final_val = final_val if final_val_batches else val_loss
    return model, TrainResult(step + 1 if cfg.max_iters > start else start, loss_value, final_val, best_val,
                              tokens_done / wall if wall > 0 else 0.0, wall, start, cfg.dtype, probe, stopped,
                              best_step if best_state is not None else None)


def _trainable(model: torch.nn.Module, clone: bool = False) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() if clone else p for n, p in model.named_parameters() if p.requires_grad}


def _probe_precision(model: torch.nn.Module, sampler: BatchSource, cfg: TrainConfig, info: DistInfo,
                     dev: torch.device) -> tuple[str, dict[str, Any]]:
    """train.dtype=auto: time float32 vs bf16 autocast on one training batch (precision.probe), the data position
    put back afterwards so the run sees the batches it would have seen. Under DDP bf16 is used only if every
    rank chose it, so all ranks train alike."""
    position = sampler.state_dict()
    x, y = sampler.sample(cfg.batch_size)
    sampler.load_state_dict(position)
    x_t, y_t = trim_targets(torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev))
    dtype, record = precision.probe(model, x_t, y_t, next_token_loss)
    if info.enabled and mean_across_ranks(float(dtype != "float32"), info, str(dev)) < 1.0:
        dtype = record["chosen"] = "float32"
    return dtype, record


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, sampler: BatchSource,
          cfg: TrainConfig, info: DistInfo, dev: torch.device, step: int) -> tuple[float, float, int]:
    """One optimiser step over this rank's share of the global batch
    -> (mean loss over all ranks, grad norm, positions fed to the model on all ranks)."""
    B, A = cfg.batch_size, cfg.grad_accum_steps
    x_all, y_all = sampler.sample(B * A * info.world_size)
    mine = slice(info.rank * B * A, (info.rank + 1) * B * A)
    x_all, y_all = torch.from_numpy(x_all[mine]).to(dev), torch.from_numpy(y_all[mine]).to(dev)
    # the micro-batch losses are summed on the device and read once per step: one host sync, not one per micro-batch
    total, n_tokens = torch.zeros((), dtype=torch.float64, device=dev), 0
    for micro in range(A):
        x, y = trim_targets(x_all[micro * B:(micro + 1) * B], y_all[micro * B:(micro + 1) * B])
        n_tokens += x.numel()
        sync = micro == A - 1 or not info.enabled  # DDP all-reduces gradients only on the last micro-batch
        ctx = contextlib.nullcontext() if sync else model.no_sync()  # type: ignore[operator]
        with ctx:
            with precision.autocast(cfg.dtype, dev.type):
                loss = next_token_loss(model, x, y)
            # the mean over micro-batches = the big batch's mean (exactly when each has as many targets)
            scaler.scale(loss / A).backward()
        total += loss.detach()
    loss_value = mean_across_ranks(total.item() / A, info, str(dev))
    if not math.isfinite(loss_value):
        opt.zero_grad(set_to_none=True)
        raise NonFiniteLossError(f"loss became {loss_value} at step {step}; stopping ({DIVERGED})")
    scaler.unscale_(opt)
    # foreach: one multi-tensor norm and scale instead of two small ops per tensor (less clipping time on CPU)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip,
                                                     foreach=dev.type in ("cpu", "cuda")))
    if not math.isfinite(grad_norm) and not scaler.is_enabled():  # fp16: the scaler skips such steps itself
        opt.zero_grad(set_to_none=True)
        raise NonFiniteLossError(f"gradient norm became {grad_norm} at step {step}; stopping ({DIVERGED})")
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss_value, grad_norm, n_tokens * info.world_size
