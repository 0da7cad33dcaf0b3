"""The one command line: `tinystack run | data | tokenizer | train | finetune | eval | generate | serve | bench`
(and `cost`, `hash-key`).

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
from tinystack.infer.commands import bench, generate
from tinystack.observe.commands import cost
from tinystack.serve.commands import bench_serve, hash_key, serve
from tinystack.tokenizer.commands import app as tokenizer_app
from tinystack.train.commands import finetune, train

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tinystack: data -> tokenizer -> training -> evaluation -> inference -> serving.")


@app.command()
def run(config: ConfigOpt = None,
        workdir: Annotated[Optional[Path], typer.Option(help="Work directory (default runs/<timestamp>).")] = None,
        set_: SetOpt = None, no_serve: Annotated[bool, typer.Option("--no-serve", help="Skip the server demo.")] = False) -> None:
    """Run the whole pipeline on the built-in corpus (or data.inputs): data -> ... -> served answers."""
    from tinystack.pipeline import run_pipeline

    cfg = resolve_config(config, set_)
    wd = workdir or Path(cfg.run.workdir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    run_pipeline(cfg, wd, serve_demo=not no_serve)


app.add_typer(data_app, name="data")
app.add_typer(tokenizer_app, name="tokenizer")
app.command("train")(train)
app.command("finetune")(finetune)
app.add_typer(eval_app, name="eval")
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
