"""`tinystack train`: train the PyTorch GPT on token files (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config


def train(tokens: Annotated[Path, typer.Option(help="Tokenizer directory with train.bin/val.bin.")],
          out: Annotated[Path, typer.Option(help="Model directory to write.")], config: ConfigOpt = None,
          set_: SetOpt = None) -> None:
    """Train the PyTorch GPT on token files and write a model directory."""
    from tinystack.pipeline import stage_train
    from tinystack.tokenizer import BPETokenizer

    tok = BPETokenizer.load(tokens)
    stage_train(resolve_config(config, set_), tokens, out, out.parent / f"{out.name}_train_log.jsonl",
                {"tokenizer_hash": tok.fingerprint()})
