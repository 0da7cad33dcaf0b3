"""The one command line: `tinystack run | data | tokenizer | model | train | finetune | eval | models | generate |
serve | bench | cost | hash-key`.

Each layer keeps its own subcommands in `<layer>/commands.py`; this file only
assembles them. Every subcommand takes `--config FILE.toml`, repeatable
`--set section.key=value` overrides and flags generated from the config fields it
uses (tinystack.cli_options.config_command), and calls the same stage functions
`tinystack run` chains (tinystack.pipeline), so a stage run by hand gives what the
pipeline gives. Errors the user can fix print one line and exit with status 2, never
a traceback (set TINYSTACK_DEBUG=1 to see one): USER_ERRORS below.

The command modules (`<layer>/commands.py`, `<layer>/stage.py`, `pipeline.py`, this file) import what a
command runs inside the command: the help, a command's flags and its one-line errors never load
torch or a model. Everywhere else an import inside a function says what it defers (tests/test_imports.py).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from tinystack.cli_options import config_command
from tinystack.config import Config
from tinystack.data.commands import app as data_app
from tinystack.errors import UserError
from tinystack.eval.commands import app as eval_app
from tinystack.eval.commands import models_app
from tinystack.infer.commands import bench, generate
from tinystack.model.commands import app as model_app
from tinystack.observe.commands import cost
from tinystack.serve.commands import bench_serve, hash_key, serve
from tinystack.tokenizer.commands import app as tokenizer_app
from tinystack.train.commands import finetune, train

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tinystack: data -> tokenizer -> training -> evaluation -> inference -> serving.")


@app.command()
@config_command("run.workdir", "run.device", "run.registry", "run.threads")
def run(cfg: Config,
        no_serve: Annotated[bool, typer.Option("--no-serve", help="Skip the server demo.")] = False,
        no_promote: Annotated[bool, typer.Option("--no-promote", help="Evaluate and gate, but do not promote "
                                                                      "into the registry.")] = False) -> None:
    """Run the whole pipeline on the built-in corpus (or data.inputs): data -> ... -> served answers."""
    from tinystack.eval.promotion import NotPromoted
    from tinystack.pipeline import run_pipeline

    wd = Path(cfg.run.workdir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run_pipeline(cfg, wd, serve_demo=not no_serve, promote=not no_promote)
    except NotPromoted as e:
        typer.secho(str(e), fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


app.add_typer(data_app, name="data")
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(model_app, name="model")
app.command("train")(train)
app.command("finetune")(finetune)
app.add_typer(eval_app, name="eval")
app.add_typer(models_app, name="models")
app.command("generate")(generate)
app.command("serve")(serve)
app.command("cost")(cost)
app.command("hash-key")(hash_key)

bench_app = typer.Typer(no_args_is_help=True, help="Measure: KV-cache decode speed, or a server under load.")
bench_app.command("kv")(bench)
bench_app.command("serve")(bench_serve)
app.add_typer(bench_app, name="bench")


# A mistake the user can fix: the layers' own UserError (bad config, absent device, diverged training), a path
# that does not exist, and ValueError, which the layers raise for values and files they reject.
USER_ERRORS = (UserError, FileNotFoundError, ValueError)


def main() -> None:
    try:
        app()
    except USER_ERRORS as e:
        if os.environ.get("TINYSTACK_DEBUG"):
            raise
        message = " ".join(str(e).split())  # one line, whatever the message held
        typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
