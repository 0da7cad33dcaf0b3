"""The training stage: token files -> a trained model directory with its lineage.

Called by `tinystack run` and `tinystack train` (also under torchrun).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from tinystack.atomic import file_sha256, read_json
from tinystack.config import Config
from tinystack.eval.threads import torch_threads
from tinystack.progress import console
from tinystack.tokenizer.stage import LINEAGE_FILE


def stage_train(cfg: Config, tok_dir: Path, model_dir: Path, log_path: Path, lineage: dict[str, Any] | None = None,
                *, resume: bool = False, ckpt_dir: Path | None = None) -> dict[str, Any]:
    """Train (torch or numpy backend, `[train] backend`), write the model directory, the log's PNG curve.
    Checkpoints go to `ckpt_dir` (default: <model_dir>_checkpoints beside it); `resume` continues from there."""
    from tinystack.model.gpt import GPTConfig
    from tinystack.tokenizer import load_tokenizer
    from tinystack.tokenizer.shards import load_tokens
    from tinystack.train import save_model_dir, train
    from tinystack.train.distributed import is_main_process

    tok = load_tokenizer(tok_dir)
    # the token files' own lineage (written by the tokenizer stage), so `tinystack train` by hand records
    # the same data manifest hash as `tinystack run`
    lineage_path = tok_dir / LINEAGE_FILE
    lineage = {**(read_json(lineage_path) if lineage_path.is_file() else {}),
               "tokenizer_hash": tok.fingerprint(), **(lineage or {})}
    m = cfg.model
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.context_length, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    val_path = tok_dir / "val.bin"
    val = load_tokens(val_path) if val_path.is_file() and len(load_tokens(val_path)) > m.context_length else None
    train_tokens = load_tokens(tok_dir / "train.bin")
    if cfg.train.backend == "numpy":
        if resume:
            raise ValueError("--resume needs the torch backend (the numpy backend writes no checkpoints)")
        from tinystack.nn.gpt_io import to_torch
        from tinystack.train.numpy_loop import train_numpy

        np_model, result = train_numpy(gcfg, train_tokens, val, cfg.train, log_path=log_path, eval_cfg=cfg.eval)
        model = to_torch(np_model)
    elif cfg.train.backend == "torch":
        ckpt_dir = ckpt_dir or model_dir.with_name(f"{model_dir.name}_checkpoints")
        with torch_threads(cfg.run.threads):
            model, result = train(gcfg, train_tokens, val, cfg.train, device=cfg.run.device, log_path=log_path,
                                  ckpt_dir=ckpt_dir, resume=resume, eval_cfg=cfg.eval)
    else:
        raise ValueError(f"train.backend must be 'torch' or 'numpy', got {cfg.train.backend!r}")
    info = result.to_dict()
    if not is_main_process():  # DDP: rank 0 writes the model directory
        return info
    lineage = {**lineage, "training": {"model": asdict(m), "train": asdict(cfg.train)}, "result": info}
    save_model_dir(model, tok, model_dir, lineage)
    if cfg.train.plot:
        from tinystack.train.plot import plot_loss_curve

        try:
            plot_loss_curve(log_path, log_path.with_suffix(".png"), title=f"{model_dir.name}: loss")
        except ImportError:
            console.print("[dim]train: matplotlib is not installed, no loss-curve PNG[/dim]")
    val_txt = f", val loss {result.final_val_loss:.3f}" if result.final_val_loss is not None else ""
    dtype = f", {result.dtype}" if result.dtype else ""  # what dtype=auto chose is part of the run's output
    console.print(f"train[{cfg.train.backend}{dtype}]: {model.num_params():,} parameters, {result.steps} steps in "
                  f"{result.wall_s:.1f}s, {result.tokens_per_s:,.0f} tokens/s, train loss "
                  f"{result.final_train_loss:.3f}{val_txt} -> {model_dir}")
    return {**info, "weights_sha256": file_sha256(model_dir / "model.safetensors")}
