"""`tinystack train`: train the GPT on token files; `tinystack finetune`: fine-tune a pretrained model on
conversations (train.finetune). Both are wired into the CLI by tinystack.cli.

Also what `torchrun --nproc_per_node=N -m tinystack train ...` runs: every rank executes
this command, joins the process group (train.distributed) and trains its share of each
batch; rank 0 writes the log, checkpoints and model directory. Every [train] and [model]
key is a flag (`--max-iters 500`, `--backend numpy`, `--threads 1`, `--n-layer 2`, ...;
tinystack.cli_options), as is `--device` (run.device).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import FINETUNE_DEFAULTS, Config


@config_command("train", "model", "run.device", "run.threads")
def train(cfg: Config, tokens: Annotated[Path, typer.Option(help="Tokenizer directory with train.bin/val.bin.")],
          out: Annotated[Path, typer.Option(help="Model directory to write.")],
          resume: Annotated[bool, typer.Option("--resume",
                                               help="Continue bit-exactly from the last checkpoint.")] = False,
          ckpt_dir: Annotated[Path | None,
                              typer.Option(help="Checkpoint directory (default <out>_checkpoints).")] = None,
          ) -> None:
    """Train the GPT on token files and write a model directory (+ checkpoints, JSONL log, PNG loss curve)."""
    from tinystack.train.distributed import shutdown_distributed
    from tinystack.train.stage import stage_train

    try:
        stage_train(cfg, tokens, out, out.parent / f"{out.name}_train_log.jsonl", resume=resume, ckpt_dir=ckpt_dir)
    finally:
        shutdown_distributed()


@config_command("finetune", "train", "data.val_fraction", "run.device", "run.threads", "run.registry",
                defaults=FINETUNE_DEFAULTS)
def finetune(cfg: Config,
             model: Annotated[Path, typer.Option(
                 help="Pretrained model directory (ours or Hugging Face GPT-2/Llama).")],
             data: Annotated[Path, typer.Option(help='Conversations JSONL: {"messages": [...]} or {"prompt", '
                                                     '"completion"}.')],
             out: Annotated[Path, typer.Option(help="Model directory to write (work files go to OUT_finetune/).")],
             resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT_finetune/checkpoints.")] = False,
             ) -> None:
    """Fine-tune a model on conversations (loss on assistant tokens only); compare it with the base on held-out
    data. `--lora r` trains rank-r adapters instead of all weights."""
    from tinystack.train.distributed import shutdown_distributed
    from tinystack.train.finetune import finetune as run_finetune

    try:
        run_finetune(model, data, out, cfg, resume=resume)
    finally:
        shutdown_distributed()
