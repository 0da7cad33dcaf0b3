"""`tinystack train`: train the GPT on token files (wired into the CLI by tinystack.cli).

Also what `torchrun --nproc_per_node=N -m tinystack train ...` runs: every rank executes
this command, joins the process group (train.distributed) and trains its share of each
batch; rank 0 writes the log, checkpoints and model directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config


def train(tokens: Annotated[Path, typer.Option(help="Tokenizer directory with train.bin/val.bin.")],
          out: Annotated[Path, typer.Option(help="Model directory to write.")], config: ConfigOpt = None,
          set_: SetOpt = None,
          resume: Annotated[bool, typer.Option("--resume", help="Continue bit-exactly from the last checkpoint.")] = False,
          backend: Annotated[Optional[str], typer.Option(help="torch | numpy (overrides train.backend).")] = None,
          ckpt_dir: Annotated[Optional[Path], typer.Option(help="Checkpoint directory (default <out>_checkpoints).")] = None,
          ) -> None:
    """Train the GPT on token files and write a model directory (+ checkpoints, JSONL log, PNG loss curve)."""
    from tinystack.train.distributed import shutdown_distributed
    from tinystack.train.stage import stage_train

    cfg = resolve_config(config, set_)
    if backend is not None:
        cfg.train.backend = backend
    try:
        stage_train(cfg, tokens, out, out.parent / f"{out.name}_train_log.jsonl", resume=resume, ckpt_dir=ckpt_dir)
    finally:
        shutdown_distributed()
