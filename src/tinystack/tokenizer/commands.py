"""`tinystack tokenizer ...`: the tokenizer's subcommands (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import Config

app = typer.Typer(no_args_is_help=True, help="Train the BPE tokenizer and encode splits.")


@app.command("train")
@config_command("tokenizer")
def train(cfg: Config, data: Annotated[Path, typer.Option(help="Directory with train/val/test.jsonl.")],
          out: Annotated[Path, typer.Option(help="Output directory (tokenizer.json + *.bin).")]) -> None:
    """Train the tokenizer ([tokenizer] kind: byte-level BPE or char) on train.jsonl and encode every split."""
    from tinystack.tokenizer.stage import stage_tokenizer

    stage_tokenizer(cfg, data, out)
