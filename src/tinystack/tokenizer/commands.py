"""`tinystack tokenizer ...`: the tokenizer's subcommands (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config

app = typer.Typer(no_args_is_help=True, help="Train the BPE tokenizer and encode splits.")


@app.command("train")
def train(data: Annotated[Path, typer.Option(help="Directory with train/val/test.jsonl.")],
          out: Annotated[Path, typer.Option(help="Output directory (tokenizer.json + *.bin).")],
          config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Train byte-level BPE on train.jsonl and encode every split to a token file."""
    from tinystack.tokenizer.stage import stage_tokenizer

    stage_tokenizer(resolve_config(config, set_), data, out)
