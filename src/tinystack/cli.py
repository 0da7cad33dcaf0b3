"""The one command line: `tinystack run | data | tokenizer | model | train | eval | generate | serve | bench | cost
| hash-key`.

Each layer keeps its own subcommands in `<layer>/commands.py`; this file only
assembles them. Every subcommand takes `--config FILE.toml` and repeatable
`--set section.key=value` overrides (tinystack.cli_options) and calls the same
stage functions `tinystack run` chains (tinystack.pipeline), so a stage run by
hand gives what the pipeline gives. Errors the user can fix (bad config, missing
file, bad input) print one line and exit with status 2, never a traceback
(set TINYSTACK_DEBUG=1 to see one).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config
from tinystack.config import ConfigError
from tinystack.data.commands import app as data_app
from tinystack.eval.commands import app as eval_app
from tinystack.eval.commands import models_app
from tinystack.infer.commands import bench, generate
from tinystack.model.commands import app as model_app
from tinystack.observe.commands import cost
from tinystack.serve.commands import bench_serve, hash_key, serve
from tinystack.tokenizer.commands import app as tokenizer_app
from tinystack.train.commands import train

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tinystack: data -> tokenizer -> training -> evaluation -> inference -> serving.")


@app.command()
def run(config: ConfigOpt = None,
        workdir: Annotated[Optional[Path], typer.Option(help="Work directory (default runs/<timestamp>).")] = None,
        set_: SetOpt = None,
        no_serve: Annotated[bool, typer.Option("--no-serve", help="Skip the server demo.")] = False,
        no_promote: Annotated[bool, typer.Option("--no-promote", help="Evaluate and gate, but do not promote "
                                                                      "into the registry.")] = False,
        registry: Annotated[Optional[Path], typer.Option(help="Model registry directory (run.registry).")] = None
        ) -> None:
    """Run the whole pipeline on the built-in corpus (or data.inputs): data -> ... -> served answers."""
    from tinystack.eval.promotion import NotPromoted
    from tinystack.pipeline import run_pipeline

    cfg = resolve_config(config, set_)
    wd = workdir or Path(cfg.run.workdir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    if registry is not None:
        cfg.run.registry = str(registry)
    try:
        run_pipeline(cfg, wd, serve_demo=not no_serve, promote=not no_promote)
    except NotPromoted as e:
        typer.secho(str(e), fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


app.add_typer(data_app, name="data")
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(model_app, name="model")
app.command("train")(train)
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


def main() -> None:
    try:
        app()
    except (ConfigError, FileNotFoundError, ValueError) as e:
        if os.environ.get("TINYSTACK_DEBUG"):
            raise
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
