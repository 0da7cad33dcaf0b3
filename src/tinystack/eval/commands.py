"""`tinystack eval`: offline metrics of a model directory (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config


def evaluate(model: Annotated[Path, typer.Option(help="Model directory.")],
             tokens: Annotated[Path, typer.Option(help="Directory with val.bin/test.bin.")],
             out: Annotated[Path, typer.Option(help="Where to write eval.json.")] = Path("eval.json"),
             config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Loss, perplexity and bits per byte on the val and test token files."""
    from tinystack.pipeline import stage_eval

    stage_eval(resolve_config(config, set_), model, tokens, out)
