"""`tinystack model ...`: model directories from pretrained models (wired into the CLI by tinystack.cli)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import Config

app = typer.Typer(no_args_is_help=True, help="Model directories: import pretrained models.")


@app.command("import")
@config_command()  # nothing in the config steers an import yet; a bad file or --set still fails
def import_(cfg: Config,
            source: Annotated[str, typer.Argument(help="A .gguf file, a Hugging Face model directory, or a known "
                                                       "name: smollm2-135m-instruct.")],
            out: Annotated[Path, typer.Option(help="Model directory to write (replaced if it is one).")]) -> None:
    """Import a pretrained model as a model directory every stage reads (float32 weights, tokenizer,
    chat template, lineage with the source's SHA-256)."""
    from tinystack.model.importer import describe, import_model

    typer.echo(describe(import_model(source, out), out))
