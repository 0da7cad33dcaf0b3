"""`tinystack train`: train the GPT on token files; `tinystack finetune`: fine-tune a pretrained model on
conversations (train.finetune). Both are wired into the CLI by tinystack.cli.

Also what `torchrun --nproc_per_node=N -m tinystack train ...` runs: every rank executes
this command, joins the process group (train.distributed) and trains its share of each
batch; rank 0 writes the log, checkpoints and model directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config


def train(tokens: Annotated[Path, typer.Option(help="Tokenizer directory with train.bin/val.bin.")],
          out: Annotated[Path, typer.Option(help="Model directory to write.")], config: ConfigOpt = None,
          set_: SetOpt = None,
          resume: Annotated[bool, typer.Option("--resume", help="Continue bit-exactly from the last checkpoint.")] = False,
          backend: Annotated[str | None, typer.Option(help="torch | numpy (overrides train.backend).")] = None,
          ckpt_dir: Annotated[Path | None, typer.Option(help="Checkpoint directory (default <out>_checkpoints).")] = None,
          ) -> None:
    """Train the GPT on token files and write a model directory (+ checkpoints, JSONL log, PNG loss curve)."""
    from tinystack.pipeline import stage_train
    from tinystack.tokenizer import load_tokenizer
    from tinystack.train.distributed import shutdown_distributed

    cfg = resolve_config(config, set_)
    if backend is not None:
        cfg.train.backend = backend
    tok = load_tokenizer(tokens)
    try:
        stage_train(cfg, tokens, out, out.parent / f"{out.name}_train_log.jsonl",
                    {"tokenizer_hash": tok.fingerprint()}, resume=resume, ckpt_dir=ckpt_dir)
    finally:
        shutdown_distributed()


def finetune(model: Annotated[Path, typer.Option(help="Pretrained model directory (ours or Hugging Face GPT-2/Llama).")],
             data: Annotated[Path, typer.Option(help='Conversations JSONL: {"messages": [...]} or {"prompt", "completion"}.')],
             out: Annotated[Path, typer.Option(help="Model directory to write (work files go to OUT_finetune/).")],
             config: ConfigOpt = None, set_: SetOpt = None,
             lora: Annotated[int | None, typer.Option(
                 "--lora", help="LoRA rank: train adapters instead of all weights (overrides finetune.lora_rank).")] = None,
             lora_alpha: Annotated[float | None, typer.Option(help="LoRA scale numerator (finetune.lora_alpha).")] = None,
             lora_targets: Annotated[str | None, typer.Option(
                 help="Comma-separated projection names to adapt, e.g. q_proj,v_proj (finetune.lora_targets).")] = None,
             resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT_finetune/checkpoints.")] = False,
             ) -> None:
    """Fine-tune a model on conversations (loss on assistant tokens only); compare it with the base on held-out data."""
    from tinystack.train.distributed import shutdown_distributed
    from tinystack.train.finetune import finetune as run_finetune

    cfg = resolve_config(config, set_)
    if lora is not None:
        cfg.finetune.lora_rank = lora
    if lora_alpha is not None:
        cfg.finetune.lora_alpha = lora_alpha
    if lora_targets is not None:
        cfg.finetune.lora_targets = [t.strip() for t in lora_targets.split(",") if t.strip()]
    try:
        run_finetune(model, data, out, cfg, resume=resume)
    finally:
        shutdown_distributed()
